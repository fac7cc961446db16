"""Protocol constants, defined once: route paths, headers, the secret wire format, and the
name of the events stream. The agent, the API, the workers and the tests import them
from here; none of them spells them out again.
"""

from __future__ import annotations

import functools
import re
from enum import StrEnum
from typing import Final


class StreamName(StrEnum):
    """A node's sequenced streams: each has its own sequence, cursor and last-good state
    (node_streams rows, created at enrollment), and its own route. The one place a
    stream is named."""

    INVENTORY = "inventory"
    TELEMETRY = "telemetry"
    # The runtime worker's report (RUNTIME below).
    RUNTIME = "runtime"


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
# The most a node reads of one line or one event of a held channel: an invoke carries
# its request body (1 MiB by default, API_MAX_BODY_BYTES), JSON-escaped; beyond this the
# node drops the channel and reconnects rather than hold an endless line in memory.
MAX_CHANNEL_EVENT_BYTES: Final = 16 * 1024 * 1024

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
# Server-sent events for operators (api/admin/events.py): one message per CloudEvent as
# the relay publishes it (`id:` its id, `event:` its CloudEvent type, `data:` its JSON),
# filtered by `node_id=` and a `type=` prefix; live only, no replay. A viewer too slow to
# keep up gets a last `event: overflow` and the stream ends.
ADMIN_EVENTS: Final = f"{ADMIN_PREFIX}/events"
ADMIN_EVENTS_OVERFLOW: Final = "overflow"

HEALTHZ: Final = "/healthz"
READYZ: Final = "/readyz"
METRICS: Final = "/metrics"

# Headers ------------------------------------------------------------------------------

ADMIN_HEADER: Final = "X-ModelForge-Admin-Token"
CORRELATION_HEADER: Final = "X-Correlation-ID"

# Secrets on the wire: ``<prefix>.<id as 32 hex>.<secret>`` ------------------------------

NODE_CREDENTIAL_PREFIX: Final = "mfn"
ENROLLMENT_TOKEN_PREFIX: Final = "mfe"
# The secret part is secrets.token_urlsafe(SECRET_BYTES): unpadded base64url, always
# SECRET_LENGTH characters of [A-Za-z0-9_-].
SECRET_BYTES: Final = 32
SECRET_LENGTH: Final = 43
# What HTTP itself strips around a header value (RFC 9110 OWS); nothing else is.
HTTP_WHITESPACE: Final = " \t"


@functools.cache
def secret_pattern(prefix: str) -> re.Pattern[str]:
    """The one spelling of a secret with this prefix, ASCII byte for byte: the id as 32
    lower-case hex digits (no dashes, braces, `urn:uuid:` or upper case, all of which
    uuid.UUID would take), the secret exactly as issued, nothing before or after (not
    even the newline `$` lets through). Group 1 is the id, group 2 the secret."""
    return re.compile(
        rf"{re.escape(prefix)}\.([0-9a-f]{{32}})\.([A-Za-z0-9_\-]{{{SECRET_LENGTH}}})\Z",
        re.ASCII,
    )


# Streams ------------------------------------------------------------------------------

EVENTS_STREAM: Final = "MODELFORGE_EVENTS"

# M5: deployments, service clients and the gateway -------------------------------------

# The runtime worker claims its deployment jobs here and reports under their leases,
# exactly like runtime jobs.
DEPLOYMENT_JOBS_NEXT: Final = f"{AGENT_PREFIX}/deployment-jobs/next"
DEPLOYMENT_JOB_PROGRESS: Final = f"{AGENT_PREFIX}/deployment-jobs/{{job_id}}/progress"
DEPLOYMENT_JOB_COMPLETE: Final = f"{AGENT_PREFIX}/deployment-jobs/{{job_id}}/complete"
DEPLOYMENT_JOB_FAIL: Final = f"{AGENT_PREFIX}/deployment-jobs/{{job_id}}/fail"
# The runtime worker's held channel (server-sent events): `event: job` notes as on
# NOTIFICATIONS, `event: invoke` with a leased invoke (schemas/gateway.py: Invoke) and
# `event: cancel` when the invoke's client left.
RUNTIME_CHANNEL: Final = f"{AGENT_PREFIX}/runtime/channel"
# The runtime worker streams an invoke's answer back here (the request body is
# llama-server's answer as it comes), under the invoke's lease (the headers below).
INVOKE_STREAM: Final = f"{AGENT_PREFIX}/invokes/{{invoke_id}}/stream"

DEPLOYMENTS: Final = f"{ADMIN_PREFIX}/deployments"
DEPLOYMENT_JOBS: Final = f"{ADMIN_PREFIX}/deployment-jobs"
SERVICE_CLIENTS: Final = f"{ADMIN_PREFIX}/service-clients"
# Model services (schemas/services.py): POST creates; GET lists; GET {id} shows one with
# its replicas; POST {id}/scale, POST {id}/rollout (a new template), GET {id}/rollout
# (its status), POST {id}/rollout/undo; DELETE {id} drains every replica, then deletes.
SERVICES: Final = f"{ADMIN_PREFIX}/services"

# The OpenAI-compatible gateway, for service clients.
GATEWAY_PREFIX: Final = "/v1"
GATEWAY_MODELS: Final = f"{GATEWAY_PREFIX}/models"
GATEWAY_CHAT_COMPLETIONS: Final = f"{GATEWAY_PREFIX}/chat/completions"
GATEWAY_COMPLETIONS: Final = f"{GATEWAY_PREFIX}/completions"
GATEWAY_EMBEDDINGS: Final = f"{GATEWAY_PREFIX}/embeddings"

# An invoke's answer stream: which lease it is under, for which gateway process, and
# the status llama-server (or the runtime worker, refusing) answered with.
INVOKE_LEASE_HEADER: Final = "X-ModelForge-Lease"
INVOKE_EPOCH_HEADER: Final = "X-ModelForge-Epoch"
INVOKE_GATEWAY_HEADER: Final = "X-ModelForge-Gateway"
INVOKE_STATUS_HEADER: Final = "X-ModelForge-Upstream-Status"
# Route receipts on every gateway answer.
ROUTE_DEPLOYMENT_HEADER: Final = "X-ModelForge-Deployment"
ROUTE_NODE_HEADER: Final = "X-ModelForge-Node"
ROUTE_DEVICE_HEADER: Final = "X-ModelForge-Device"
ROUTE_REASON_HEADER: Final = "X-ModelForge-Route-Reason"
ROUTE_OVERHEAD_HEADER: Final = "X-ModelForge-Gateway-Overhead-Ms"

SERVICE_CLIENT_PREFIX: Final = "mfs"

# Core NATS subjects (outside the events stream's `modelforge.v1.>`: never stored):
# an invoke for a node's runtime channel (a request: the API process holding the
# channel answers), and its answer's chunks for the gateway process holding the client.
INVOKE_SUBJECTS: Final = "modelforge.invoke.v1"


def invoke_node_subject(node_id: object) -> str:
    return f"{INVOKE_SUBJECTS}.node.{node_id}"


def invoke_reply_subject(gateway: str, invoke_id: object) -> str:
    return f"{INVOKE_SUBJECTS}.gateway.{gateway}.{invoke_id}"
