"""Deployments (M5): an artifact from a node's inventory, served by that node's runtime
worker on one device under a RuntimeProfile and a RuntimeEnvironment, as a served model
name with roles, until an operator drains or unloads it.

Lifecycle: `pending → loading → ready → draining → unloaded`, plus `failed` (the load
failed for good, with the typed runtime error) and `unavailable` (its node went offline,
its runtime worker's channel is gone, or its health failed: back to `ready` when the node
reports it loaded again, or a health check passes). The
deployment reconciler (workers/deployments.py) moves it along with typed jobs over the
shared leases: deployment.load.v1, deployment.health.v1, deployment.drain.v1 and
deployment.unload.v1. What each lease carries is an exact, server-resolved value (a
verified file, an admitted profile), never a path or a flag of the operator's choosing.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

from pydantic import BeforeValidator, Discriminator, Field, Strict, Tag

from schemas.base import Count, NodePath, Number, Positive, Text, WireModel, json_integer
from schemas.endpoints import ChatTemplateCaps, Endpoints, default_endpoints
from schemas.jobs import (
    Attempts,
    JobFamily,
    JobKind,
    JobType,
    JobView,
    Lease,
    LeaseFence,
    RouteDocs,
)
from schemas.protocol import (
    DEPLOYMENT_JOB_COMPLETE,
    DEPLOYMENT_JOB_FAIL,
    DEPLOYMENT_JOB_PROGRESS,
    DEPLOYMENT_JOBS_NEXT,
)
from schemas.runtime import (
    ArtifactRef,
    DeviceId,
    ResolvedLoras,
    RuntimeJobFail,
    RuntimeJobOutcome,
    RuntimeJobProgress,
    RuntimeProgressView,
    ServerHealth,
    Sha256Hex,
    StoredSettings,
    VerifiedFile,
)


class DeploymentState(StrEnum):
    """pending, loading, ready, draining, unloaded; failed: its load failed for good;
    unavailable: not served now, with why in its failure (node_offline: its node went
    offline; runtime_gone: its node's runtime worker held its channel and that channel
    is gone, within the channel's keep-alive plus a grace; health_failed: a check
    failed), and back to ready once its runtime worker reports it loaded again."""

    PENDING = "pending"
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    UNLOADED = "unloaded"
    FAILED = "failed"
    UNAVAILABLE = "unavailable"


# Ended: nothing more happens to it (a new deployment is a new id).
ENDED_STATES: Final = frozenset({DeploymentState.UNLOADED, DeploymentState.FAILED})

# A served model's name (what a client puts in `model`), and a role (RoleMesh's).
ServedModel = Annotated[
    str, Strict(), Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")
]
RoleName = Annotated[
    str, Strict(), Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9._-]*$")
]
Roles = Annotated[list[RoleName], Field(max_length=16)]
Concurrency = Annotated[int, Strict(), Field(ge=1, le=256), BeforeValidator(json_integer)]
DeadlineSeconds = Annotated[Number, Field(ge=0, le=3600)]


class DeploymentCreate(WireModel):
    """POST …/deployments. The control plane resolves the artifact to its verified file
    on the node and admits the profile, as for a probe."""

    node_id: uuid.UUID
    device_id: DeviceId
    artifact: ArtifactRef
    profile_id: uuid.UUID
    environment_id: uuid.UUID
    model: ServedModel
    roles: Roles = Field(default_factory=list)
    # What it serves: the gateway routes only these to it; `embeddings` loads the model
    # with embeddings on (the profile sets `pooling`), and each is checked at load.
    endpoints: Endpoints = Field(default_factory=default_endpoints)
    # Invokes at once on the node; past it the deployment answers busy (the gateway
    # tries another, then 429).
    max_concurrent: Concurrency = 4
    # Load attempts (with the job's backoff) before the deployment ends `failed`.
    max_attempts: Attempts = 3


class DeploymentDrain(WireModel):
    """POST …/deployments/{id}/drain: no new invokes from now on; those in flight get
    `deadline_s` to finish; then the model is unloaded. POST …/unload is a drain with
    a deadline of 0 (in flight invokes are cut at once), from any state."""

    deadline_s: DeadlineSeconds = 60.0


class DeploymentFailure(WireModel):
    code: str
    detail: str = ""


class DeploymentView(WireModel):
    id: uuid.UUID
    model: str
    roles: list[str]
    endpoints: list[str]
    node_id: uuid.UUID
    device_id: str
    artifact: ArtifactRef
    profile_id: uuid.UUID
    profile_version: int
    environment_id: uuid.UUID
    state: DeploymentState
    max_concurrent: int
    # What its chat template can do, as its node reported at its last load (None: not
    # loaded yet, or a node that does not report it).
    capabilities: ChatTemplateCaps | None = None
    # Why it failed, or why it is unavailable (node_offline, runtime_gone, health_failed).
    failure: DeploymentFailure | None
    # Invokes at once on the node, as its runtime worker last reported.
    queue_depth: int | None
    # The gateway does not route to it before this (it failed or timed out an invoke).
    cooldown_until: datetime | None
    cooldown_reason: str | None
    drain_deadline_s: float | None
    # The job that moves it now (or moved it last).
    job_id: uuid.UUID | None
    created_at: datetime
    updated_at: datetime
    state_changed_at: datetime


class DeploymentList(WireModel):
    items: list[DeploymentView]


# Leases ----------------------------------------------------------------------------------


class LoadSpec(WireModel):
    """What a deployment.load.v1 lease carries: exact values only, like a probe's. The
    runtime worker checks `settings` against the allow-list again and the files against
    their digests before it starts anything."""

    deployment_id: uuid.UUID
    # The name llama-server answers under (its alias), and clients call.
    model: ServedModel
    device_id: DeviceId
    artifact_path: NodePath
    artifact_digest: Sha256Hex
    profile_id: uuid.UUID
    profile_version: Positive
    settings: StoredSettings
    draft_model: VerifiedFile | None = None
    loras: ResolvedLoras = Field(default_factory=list)
    environment_id: uuid.UUID
    binary_sha256: Sha256Hex
    max_concurrent: Concurrency
    # `--embeddings` when embeddings are served; each endpoint is checked at load.
    endpoints: Endpoints = Field(default_factory=default_endpoints)


class TargetSpec(WireModel):
    """What a deployment.health.v1, drain.v1 or unload.v1 lease carries."""

    deployment_id: uuid.UUID
    device_id: DeviceId
    # Drain: how long invokes in flight may take to finish before the unload.
    deadline_s: DeadlineSeconds = 0.0


TargetKind = Literal[JobKind.DEPLOYMENT_HEALTH, JobKind.DEPLOYMENT_DRAIN, JobKind.DEPLOYMENT_UNLOAD]


class LoadClaim(WireModel):
    job_id: uuid.UUID
    kind: Literal[JobKind.DEPLOYMENT_LOAD] = JobKind.DEPLOYMENT_LOAD
    attempt: Attempts
    spec: LoadSpec
    lease: Lease


class TargetClaim(WireModel):
    job_id: uuid.UUID
    kind: TargetKind
    attempt: Attempts
    spec: TargetSpec
    lease: Lease


# GET …/deployment-jobs/next answers one of these, by `kind`.
DeploymentClaim = Annotated[LoadClaim | TargetClaim, Field(discriminator="kind")]

Seconds = Annotated[Number, Field(ge=0, le=86_400)]


class LoadComplete(WireModel):
    kind: Literal[JobKind.DEPLOYMENT_LOAD] = JobKind.DEPLOYMENT_LOAD
    lease: LeaseFence
    device_id: DeviceId
    health: ServerHealth
    load_s: Seconds
    # From llama-server's /props after the load (None: it did not say).
    capabilities: ChatTemplateCaps | None = None


class HealthComplete(WireModel):
    kind: Literal[JobKind.DEPLOYMENT_HEALTH]
    lease: LeaseFence
    health: ServerHealth
    in_flight: Count


class DrainComplete(WireModel):
    kind: Literal[JobKind.DEPLOYMENT_DRAIN]
    lease: LeaseFence
    # Invokes that finished within the deadline, and those still running at it (cut).
    finished: Count
    cut: Count
    settle_s: Seconds | None = None


class UnloadComplete(WireModel):
    kind: Literal[JobKind.DEPLOYMENT_UNLOAD]
    lease: LeaseFence
    # False: it was not loaded here (a restarted worker), which is as good.
    unloaded: bool
    cut: Count = 0
    settle_s: Seconds | None = None


def _completed_kind(value: Any) -> str | None:
    """The body's kind; a load's when it names none (the only one whose `kind` may be
    left out, so the JSON Schema says exactly what is taken)."""
    if isinstance(value, dict):
        kind = value.get("kind", JobKind.DEPLOYMENT_LOAD.value)
        return kind if isinstance(kind, str) else None
    if isinstance(value, LoadComplete | HealthComplete | DrainComplete | UnloadComplete):
        return value.kind.value
    return None


# POST …/deployment-jobs/{id}/complete: the body of the job's kind.
DeploymentComplete = Annotated[
    Annotated[LoadComplete, Tag(JobKind.DEPLOYMENT_LOAD.value)]
    | Annotated[HealthComplete, Tag(JobKind.DEPLOYMENT_HEALTH.value)]
    | Annotated[DrainComplete, Tag(JobKind.DEPLOYMENT_DRAIN.value)]
    | Annotated[UnloadComplete, Tag(JobKind.DEPLOYMENT_UNLOAD.value)],
    Discriminator(_completed_kind),
]


# Results (store/results.py) and operators' views -------------------------------------------


class LoadResult(WireModel):
    device_id: str
    health: ServerHealth
    load_s: float
    capabilities: ChatTemplateCaps | None = None


class HealthResult(WireModel):
    health: ServerHealth
    in_flight: int


class DrainResult(WireModel):
    finished: int
    cut: int
    settle_s: float | None = None


class UnloadResult(WireModel):
    unloaded: bool
    cut: int = 0
    settle_s: float | None = None


class LoadJobView(JobView):
    kind: Literal[JobKind.DEPLOYMENT_LOAD]
    spec: LoadSpec
    progress: RuntimeProgressView | None
    result: LoadResult | None


class HealthJobView(JobView):
    kind: Literal[JobKind.DEPLOYMENT_HEALTH]
    spec: TargetSpec
    progress: RuntimeProgressView | None
    result: HealthResult | None


class DrainJobView(JobView):
    kind: Literal[JobKind.DEPLOYMENT_DRAIN]
    spec: TargetSpec
    progress: RuntimeProgressView | None
    result: DrainResult | None


class UnloadJobView(JobView):
    kind: Literal[JobKind.DEPLOYMENT_UNLOAD]
    spec: TargetSpec
    progress: RuntimeProgressView | None
    result: UnloadResult | None


# A deployment job of any kind, as an operator sees it, by `kind`.
DeploymentKindView = LoadJobView | HealthJobView | DrainJobView | UnloadJobView
DeploymentJobView = Annotated[DeploymentKindView, Field(discriminator="kind")]


DEPLOYMENT_FAMILY: Final = JobFamily(
    name="deployment",
    next=DEPLOYMENT_JOBS_NEXT,
    progress_path=DEPLOYMENT_JOB_PROGRESS,
    complete_path=DEPLOYMENT_JOB_COMPLETE,
    fail_path=DEPLOYMENT_JOB_FAIL,
    types=(
        JobType(
            kind=JobKind.DEPLOYMENT_LOAD,
            spec=LoadSpec,
            claim=LoadClaim,
            completion=LoadComplete,
            result=LoadResult,
            view=LoadJobView,
        ),
        JobType(
            kind=JobKind.DEPLOYMENT_HEALTH,
            spec=TargetSpec,
            claim=TargetClaim,
            completion=HealthComplete,
            result=HealthResult,
            view=HealthJobView,
        ),
        JobType(
            kind=JobKind.DEPLOYMENT_DRAIN,
            spec=TargetSpec,
            claim=TargetClaim,
            completion=DrainComplete,
            result=DrainResult,
            view=DrainJobView,
        ),
        JobType(
            kind=JobKind.DEPLOYMENT_UNLOAD,
            spec=TargetSpec,
            claim=TargetClaim,
            completion=UnloadComplete,
            result=UnloadResult,
            view=UnloadJobView,
        ),
    ),
    claim=DeploymentClaim,
    progress=RuntimeJobProgress,
    progress_view=RuntimeProgressView,
    completion=DeploymentComplete,
    completed=RuntimeJobOutcome,
    fail=RuntimeJobFail,
    docs=RouteDocs(
        claim="The node's next deployment job of any kind, by `kind`.",
        progress="The phase; extends the lease. The answer says whether to stop (cancelled).",
        complete="""The body must be of the job's kind; it becomes the job's result, and moves the
    deployment (a load makes it ready, a drain or unload unloaded).""",
        fail="""A normalised runtime failure: retried with backoff while it may help; a load that
    fails for good makes its deployment `failed` with this code.""",
    ),
)

# Every kind the runtime worker claims through …/deployment-jobs/next.
KINDS: Final = DEPLOYMENT_FAMILY.kinds


class DeploymentJobList(WireModel):
    items: list[DeploymentJobView]


# What the runtime worker reports of its deployments (schemas/runtime_local.py).


class ReportedDeployment(WireModel):
    deployment_id: uuid.UUID
    device_id: DeviceId
    model: Annotated[Text, Field(min_length=1, max_length=128)]
    state: Literal["ready", "draining"]
    in_flight: Count
