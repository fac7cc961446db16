"""Work the control plane hands to nodes: the lease every job kind shares.

A job is claimed through its kind's ``…/next`` route and answered with a lease: an id,
a fencing epoch and an expiry. Every later report (progress, complete, fail) carries the
lease id and epoch back; the control plane accepts it only from the current holder of
an unexpired lease, so a holder that lost its lease (it stalled, its lease expired and
the job went to another attempt) can never overwrite the new attempt's work. One lease
mechanism (store/leases.py) serves artifact, runtime and deployment jobs alike; the
kind-specific parts (what the job carries, what its completion proves) live in their
own modules (schemas/artifacts.py).

Each family of kinds is declared once, as a JobFamily beside its own wire types
(schemas/artifacts.py: ARTIFACT_FAMILY, schemas/runtime.py: RUNTIME_FAMILY,
schemas/deployments.py: DEPLOYMENT_FAMILY; all of them in schemas/job_families.py): its
routes, the claim, progress, completion and result of each kind, its view and the
capability a node advertises for it. The API's agent routes (api/agent/jobs.py), the
admin view, the results table and the store's per-kind checks are derived from it. The
declaration types are here and the declarations beside their types because those
types are built on this module's lease: declaring them here would make a circle.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Final

from pydantic import AfterValidator, BeforeValidator, Field, Strict, WithJsonSchema

from schemas.base import SAFE_INT_MAX, Flag, Note, Number, WireModel, json_integer


class JobKind(StrEnum):
    ARTIFACT_ACQUIRE = "artifact.acquire.v1"
    # An artifact deleted from a node's root, its files verified first (schemas/artifacts.py).
    ARTIFACT_EVICT = "artifact.evict.v1"
    RUNTIME_PROBE = "runtime.probe.v1"
    RUNTIME_HEALTH = "runtime.health.v1"
    RUNTIME_UNLOAD = "runtime.unload.v1"
    # A deployment's lifecycle on its node (schemas/deployments.py), claimed by the
    # runtime worker from the deployment-jobs routes.
    DEPLOYMENT_LOAD = "deployment.load.v1"
    DEPLOYMENT_HEALTH = "deployment.health.v1"
    DEPLOYMENT_DRAIN = "deployment.drain.v1"
    DEPLOYMENT_UNLOAD = "deployment.unload.v1"
    # One gateway request, delivered with its lease on the runtime worker's held channel
    # (schemas/gateway.py: Invoke); never a row in the jobs table.
    DEPLOYMENT_INVOKE = "deployment.invoke.v1"


class JobState(StrEnum):
    # Waiting to be claimed (also after a retryable failure, until its backoff ends).
    QUEUED = "queued"
    # Claimed: a node holds the lease.
    LEASED = "leased"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_STATES: Final = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})

Epoch = Annotated[int, Strict(), Field(ge=1, le=SAFE_INT_MAX), BeforeValidator(json_integer)]
Attempts = Annotated[int, Strict(), Field(ge=1, le=20), BeforeValidator(json_integer)]
# A node sleeps on it between renewals: never zero (a busy loop), never past a day.
RenewWithin = Annotated[Number, Field(gt=0, le=86_400)]


class Lease(WireModel):
    """What a claim hands out: present lease_id and epoch with every report."""

    lease_id: uuid.UUID
    # The fencing value: it grows with every claim of the job, so a report carrying an
    # older one comes from a holder that lost the lease.
    epoch: Epoch
    expires_at: datetime
    # Report progress at least this often to keep the lease.
    renew_within_s: RenewWithin


class JobClaim(WireModel):
    """What a kind's claim (GET …/next) carries besides its `kind` and `spec`: the job,
    the attempt and the lease to report under (schemas/artifacts.py: EvictClaim)."""

    job_id: uuid.UUID
    attempt: Attempts
    lease: Lease


class LeaseFence(WireModel):
    """The lease a report is made under."""

    lease_id: uuid.UUID
    epoch: Epoch


class FailureCode(StrEnum):
    CHECKSUM_MISMATCH = "checksum_mismatch"
    SIZE_MISMATCH = "size_mismatch"
    INSUFFICIENT_SPACE = "insufficient_space"
    SOURCE_UNAVAILABLE = "source_unavailable"
    SOURCE_NOT_FOUND = "source_not_found"
    SOURCE_UNAUTHORIZED = "source_unauthorized"
    PATH_NOT_ALLOWED = "path_not_allowed"
    STALLED = "stalled"
    CANCELLED = "cancelled"
    INTERNAL = "internal"
    # Decided by the control plane, never reported by a node: the lease ran out on the
    # last attempt, or the verified inventory did not match the job.
    LEASE_EXPIRED = "lease_expired"
    INVENTORY_MISMATCH = "inventory_mismatch"


# Decided by the control plane, never reported by a node.
VERDICTS: Final = frozenset({FailureCode.LEASE_EXPIRED, FailureCode.INVENTORY_MISMATCH})


def _reported(code: FailureCode) -> FailureCode:
    if code in VERDICTS:
        raise ValueError(f"{code.value} is the control plane's verdict, not a node's report")
    return code


# What a node may report in …/fail: every FailureCode but the control plane's verdicts
# (and the OpenAPI document lists exactly those).
ReportedFailure = Annotated[
    FailureCode,
    AfterValidator(_reported),
    WithJsonSchema(
        {
            "title": "ReportedFailure",
            "type": "string",
            "enum": [code.value for code in FailureCode if code not in VERDICTS],
        }
    ),
]


class FailReport(WireModel):
    lease: LeaseFence
    code: ReportedFailure
    # Whether another attempt may help (a flaky source: yes; a checksum the source
    # keeps serving wrong: no). Bounded by the job's max_attempts either way.
    retryable: Flag
    detail: Note = ""


class FailAnswer(WireModel):
    job_id: uuid.UUID
    state: JobState
    # Set when the job goes back to the queue: not claimable before this.
    retry_at: datetime | None = None


class ProgressAnswer(WireModel):
    job_id: uuid.UUID
    # The operator cancelled the job: stop, remove staging files, report fail(cancelled).
    cancel_requested: bool
    lease: Lease


# What operators see ----------------------------------------------------------------------


class LeaseView(WireModel):
    """The lease a node holds now (a job that is not leased has none)."""

    epoch: int
    expires_at: datetime


class JobFailureView(WireModel):
    """Why the last attempt failed (a queued job waiting out its retry keeps it)."""

    # A FailureCode, or one of the kind's own (schemas/runtime.py: RuntimeFailure).
    code: str
    retryable: bool
    detail: str = ""


class JobView(WireModel):
    """What an operator sees of a job, the same for every kind: its state, attempts,
    lease and failure. Each kind's view (schemas/artifacts.py: ArtifactJobView,
    schemas/runtime.py: ProbeJobView, …) narrows `kind` to its own and adds what only
    it has, typed: `spec` (what the lease carries), `progress` (the current attempt's
    latest report) and `result` (what its completion established)."""

    id: uuid.UUID
    kind: JobKind
    node_id: uuid.UUID
    state: JobState
    attempt: int
    max_attempts: int
    # Not claimable before this (a retry's backoff).
    available_at: datetime
    lease: LeaseView | None
    cancel_requested: bool
    failure: JobFailureView | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None


# Declarations ---------------------------------------------------------------------------


@dataclass(frozen=True)
class JobType:
    """One job kind: what its lease carries (`spec`), the claim that hands it out, the
    completion a node reports, the result that completion establishes, and how an
    operator sees it."""

    kind: JobKind
    spec: type[WireModel]
    claim: type[WireModel]
    completion: type[WireModel]
    result: type[WireModel]
    view: type[JobView]
    # What a node advertises to be handed this kind (its heartbeat's capabilities);
    # None where the process that claims it advertises nothing (the runtime worker).
    capability: str | None = None


@dataclass(frozen=True)
class RouteDocs:
    """What the OpenAPI document says of each of a family's agent routes."""

    claim: str
    progress: str
    complete: str
    fail: str


@dataclass(frozen=True)
class JobFamily:
    """The kinds a node claims from one set of agent routes: GET `next` leases the
    node's next job of any of them, answered as that kind's claim (by `kind`); progress,
    complete and fail are then reported under the lease, each kind's completion in its
    own body."""

    # Names the routes' operations (claim_<name>_job, report_<name>_progress, …).
    name: str
    next: str
    progress_path: str
    complete_path: str
    fail_path: str
    types: tuple[JobType, ...]
    # The …/next answer: the one kind's claim, or the kinds' claims by `kind`.
    claim: Any
    progress: type[WireModel]
    # How an operator sees the current attempt's latest progress.
    progress_view: type[WireModel]
    # The …/complete body: the one kind's completion, or the kinds' by `kind`.
    completion: Any
    # The …/complete answer and the …/fail body.
    completed: type[WireModel]
    fail: type[WireModel]
    docs: RouteDocs

    @property
    def kinds(self) -> tuple[JobKind, ...]:
        return tuple(job_type.kind for job_type in self.types)

    def of(self, kind: str) -> JobType:
        """The declaration of one of this family's kinds (a job's `kind` column)."""
        for job_type in self.types:
            if job_type.kind == kind:
                return job_type
        raise ValueError(f"{kind} is not a {self.name} job")
