"""Protocol constants, defined once: route paths, headers, the secret wire format, and the
name of the events stream. The agent, the API, the workers and the tests import them
from here; none of them spells them out again.
"""

from __future__ import annotations

import re
from typing import Final

# Routes -------------------------------------------------------------------------------

AGENT_PREFIX: Final = "/api/v1/agent"
ENROLL: Final = f"{AGENT_PREFIX}/enroll"
HEARTBEAT: Final = f"{AGENT_PREFIX}/heartbeat"
INVENTORY: Final = f"{AGENT_PREFIX}/inventory"
TELEMETRY: Final = f"{AGENT_PREFIX}/telemetry"
# Artifact jobs: claim the next one; then report under its lease.
ARTIFACT_JOBS_NEXT: Final = f"{AGENT_PREFIX}/artifact-jobs/next"
ARTIFACT_JOB_PROGRESS: Final = f"{AGENT_PREFIX}/artifact-jobs/{{job_id}}/progress"
ARTIFACT_JOB_COMPLETE: Final = f"{AGENT_PREFIX}/artifact-jobs/{{job_id}}/complete"
ARTIFACT_JOB_FAIL: Final = f"{AGENT_PREFIX}/artifact-jobs/{{job_id}}/fail"
# The runtime worker (beside the agent, with the node's credential): its report stream,
# then runtime probes claimed and reported under leases exactly like artifact jobs.
RUNTIME: Final = f"{AGENT_PREFIX}/runtime"
RUNTIME_JOBS_NEXT: Final = f"{AGENT_PREFIX}/runtime-probes/next"
RUNTIME_JOB_PROGRESS: Final = f"{AGENT_PREFIX}/runtime-probes/{{job_id}}/progress"
RUNTIME_JOB_COMPLETE: Final = f"{AGENT_PREFIX}/runtime-probes/{{job_id}}/complete"
RUNTIME_JOB_FAIL: Final = f"{AGENT_PREFIX}/runtime-probes/{{job_id}}/fail"
# Server-sent events: `event: job` with `{"event": "job.created", "job_id": ...,
# "kind": "runtime.probe.v1"}` when the node has work (or a cancel); comments as
# keep-alives. A wake-up, never the work; the kind says which of the node's loops claims.
NOTIFICATIONS: Final = f"{AGENT_PREFIX}/notifications"

ADMIN_PREFIX: Final = "/api/v1/admin"
TOKENS: Final = f"{ADMIN_PREFIX}/hardware/enrollment-tokens"
NODES: Final = f"{ADMIN_PREFIX}/hardware/nodes"
AUDIT: Final = f"{ADMIN_PREFIX}/audit"
FLEET: Final = f"{ADMIN_PREFIX}/fleet"
DEAD_LETTERS: Final = f"{ADMIN_PREFIX}/workers/dead-letters"
ARTIFACT_JOBS: Final = f"{ADMIN_PREFIX}/artifact-jobs"
RUNTIME_PROFILES: Final = f"{ADMIN_PREFIX}/runtime/profiles"
RUNTIME_ENVIRONMENTS: Final = f"{ADMIN_PREFIX}/runtime/environments"
RUNTIME_JOBS: Final = f"{ADMIN_PREFIX}/runtime/probes"
RUNTIME_EVIDENCE: Final = f"{ADMIN_PREFIX}/runtime/evidence"

HEALTHZ: Final = "/healthz"
READYZ: Final = "/readyz"
METRICS: Final = "/metrics"

# Headers ------------------------------------------------------------------------------

ADMIN_HEADER: Final = "X-ModelForge-Admin-Token"
CORRELATION_HEADER: Final = "X-Correlation-ID"

# Secrets on the wire: ``<prefix>.<id as 32 hex>.<secret>`` ------------------------------

NODE_CREDENTIAL_PREFIX: Final = "mfn"
ENROLLMENT_TOKEN_PREFIX: Final = "mfe"
SECRET_MIN_LENGTH: Final = 20
SECRET_MAX_LENGTH: Final = 100


def secret_pattern(prefix: str) -> re.Pattern[str]:
    """The shape of a secret with this prefix; group 1 is the id."""
    return re.compile(
        rf"^{re.escape(prefix)}\.([0-9a-f]{{32}})\."
        rf"[A-Za-z0-9_\-]{{{SECRET_MIN_LENGTH},{SECRET_MAX_LENGTH}}}$"
    )


# Streams ------------------------------------------------------------------------------

EVENTS_STREAM: Final = "MODELFORGE_EVENTS"
