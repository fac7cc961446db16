"""Model services (issue 32): "serve this model, N replicas". A service is desired state
(a served model name, its artifact, profile and environment, how many replicas, where
they may go, how an update rolls out); the service reconciler in the workers
(workers/services.py) places each replica on a node's device (store/services/placement.py),
acquires the artifact there if it is missing (an artifact job), loads it (a deployment),
replaces replicas that were lost, drains on a scale-down and rolls out a changed template
one replica at a time. Nothing new crosses to the node: a replica is an artifact job and
a deployment, which the node checks as it checks any other.

Replica lifecycle: `acquiring` (its artifact job runs on the chosen node) → `loading`
(its deployment is pending or loading) → `ready` → `draining` → `ended`; `unavailable`
while its deployment is (its node went offline, its runtime worker's channel is gone),
replaced by another after a grace, and drained as a surplus if it comes back.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Final, Literal

from pydantic import BeforeValidator, ConfigDict, Field, Strict, model_validator

from schemas.artifacts import CommitId, Repository, Revision
from schemas.base import (
    LABEL_KEY_PATTERN,
    Count,
    FilePath,
    Label,
    LabelValue,
    Number,
    WireModel,
    json_integer,
)
from schemas.deployments import Concurrency, DeadlineSeconds, Roles, ServedModel
from schemas.endpoints import Endpoints, default_endpoints

ReplicaCount = Annotated[int, Strict(), Field(ge=0, le=1000), BeforeValidator(json_integer)]
PerNode = Annotated[int, Strict(), Field(ge=1, le=64), BeforeValidator(json_integer)]
Surge = Annotated[int, Strict(), Field(ge=1, le=16), BeforeValidator(json_integer)]
Unavailable = Annotated[int, Strict(), Field(ge=0, le=16), BeforeValidator(json_integer)]
Selector = Annotated[
    dict[Label, LabelValue],
    Field(
        max_length=16,
        # As schemas/base.py: Labels: propertyNames says what the validator enforces.
        json_schema_extra={
            "propertyNames": {"minLength": 1, "maxLength": 63, "pattern": LABEL_KEY_PATTERN},
            "additionalProperties": False,
        },
    ),
]
# The placement reasons and the receipt's message are bounded: a receipt is stored and
# shown at every decision.
ReceiptText = Annotated[str, Field(max_length=1000)]


class DeviceKind(StrEnum):
    """The kind of device a replica needs (the runtime worker's reported backend)."""

    CPU = "cpu"
    CUDA = "cuda"


class ServiceState(StrEnum):
    """active; deleting: every replica drains, then the service is deleted (its name is
    free again); deleted: kept for its history."""

    ACTIVE = "active"
    DELETING = "deleting"
    DELETED = "deleted"


class RolloutState(StrEnum):
    """complete: every replica runs the current template; progressing: replicas of an
    older one are replaced one at a time; stopped: a new replica failed, the old ones
    keep serving until an undo or another rollout."""

    COMPLETE = "complete"
    PROGRESSING = "progressing"
    STOPPED = "stopped"


class ReplicaPhase(StrEnum):
    ACQUIRING = "acquiring"
    LOADING = "loading"
    READY = "ready"
    UNAVAILABLE = "unavailable"
    DRAINING = "draining"
    ENDED = "ended"


# Phases that hold (or are about to hold) a device and count against the service.
LIVE_PHASES: Final = frozenset(
    {
        ReplicaPhase.ACQUIRING,
        ReplicaPhase.LOADING,
        ReplicaPhase.READY,
        ReplicaPhase.UNAVAILABLE,
        ReplicaPhase.DRAINING,
    }
)


class PlacementReason(StrEnum):
    """Why a node (or its devices) was not chosen; counted in a receipt."""

    OFFLINE = "offline"
    DISABLED = "disabled"
    SELECTOR = "selector"
    NO_RUNTIME = "no_runtime"
    ENVIRONMENT = "environment"
    DEVICE_KIND = "device_kind"
    DEVICE_BUSY = "device_busy"
    INSUFFICIENT_MEMORY = "insufficient_memory"
    SPREAD = "spread"
    BACKOFF = "backoff"
    NO_ROOT = "no_root"


# Requests ---------------------------------------------------------------------------------


class ServiceArtifact(WireModel):
    """The model file, from the artifact source: resolved once by the control plane to
    an exact commit (as an artifact job's manifest is)."""

    repository: Repository
    revision: Revision = "main"
    path: FilePath


class Placement(WireModel):
    # Every label must match (an empty selector matches every node).
    selector: Selector = Field(default_factory=dict)
    # None: any device the runtime worker reports.
    device_kind: DeviceKind | None = None
    # Replicas of this service on one node at most (spread across nodes).
    max_per_node: PerNode = 1


class UpdateStrategy(WireModel):
    """How a changed template rolls out: at most `max_surge` replicas above the desired
    count, at most `max_unavailable` below it; a replaced or surplus replica drains with
    `drain_deadline_s` for its streams in flight."""

    max_surge: Surge = 1
    max_unavailable: Unavailable = 0
    drain_deadline_s: DeadlineSeconds = 60.0


class Autoscale(WireModel):
    """Between `min_replicas` and `max_replicas`, on the gateway's own measurements: the
    invokes in flight or queued per ready replica against `target_queue_per_replica`
    (and the time to first token against `target_ttft_s` when set). Hysteresis: down only
    below half the target; `cooldown_s` between two changes."""

    min_replicas: ReplicaCount = 1
    max_replicas: Annotated[
        ReplicaCount,
        # A rule between two fields, which JSON Schema cannot state (the OpenAPI
        # contract's fuzzing reads the phrase: tests/test_schemathesis.py).
        Field(description="must be at least min_replicas"),
    ]
    target_queue_per_replica: Annotated[Number, Field(gt=0, le=1000)] = 2.0
    target_ttft_s: Annotated[Number, Field(gt=0, le=600)] | None = None
    cooldown_s: Annotated[Number, Field(ge=0, le=86_400)] = 60.0

    @model_validator(mode="after")
    def _bounds(self) -> Autoscale:
        if self.max_replicas < self.min_replicas:
            raise ValueError("max_replicas must be at least min_replicas")
        return self


class ServiceCreate(WireModel):
    """POST …/services."""

    name: ServedModel
    roles: Roles = Field(default_factory=list)
    artifact: ServiceArtifact
    profile_id: uuid.UUID
    # None: the environment each node's runtime worker reports (the newest it lists).
    environment_id: uuid.UUID | None = None
    replicas: ReplicaCount = 1
    autoscale: Autoscale | None = None
    placement: Placement = Field(default_factory=Placement)
    strategy: UpdateStrategy = Field(default_factory=UpdateStrategy)
    max_concurrent: Concurrency = 4
    # What every replica serves (as a deployment's `endpoints`).
    endpoints: Endpoints = Field(default_factory=default_endpoints)


class ServiceScale(WireModel):
    """POST …/services/{id}/scale. With autoscale on, the count is clamped to its bounds
    and autoscale moves it from there."""

    replicas: ReplicaCount


class ServiceRollout(WireModel):
    """POST …/services/{id}/rollout: a new template (what changes), rolled out one
    replica at a time."""

    # At least one field named (the validator below), stated in the schema too.
    model_config = ConfigDict(json_schema_extra={"minProperties": 1})

    artifact: ServiceArtifact | None = None
    profile_id: uuid.UUID | None = None
    environment_id: uuid.UUID | None = None
    max_concurrent: Concurrency | None = None
    endpoints: Endpoints | None = None

    @model_validator(mode="after")
    def _something(self) -> ServiceRollout:
        if not self.model_fields_set:
            raise ValueError(
                "name at least one of artifact, profile_id, environment_id, max_concurrent,"
                " endpoints"
            )
        return self


# Stored values and views ----------------------------------------------------------------------


class ResolvedArtifact(WireModel):
    repository: Repository
    revision: Revision
    commit: CommitId
    path: FilePath
    size_bytes: Count
    # The file's sha256 when the source gives one (an LFS file).
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None


class MemoryEstimate(WireModel):
    """What one replica needs on its device, in bytes: the weights (by the GGUF's tensor
    sizes), the KV cache (the profile's context size across its parallel slots) and the
    compute buffers; `source` says where the figure came from (the GGUF header, the file
    size when the header could not be read, or measured on a node)."""

    weights_bytes: Count
    kv_cache_bytes: Count
    compute_bytes: Count
    total_bytes: Count
    source: Literal["gguf_header", "file_size", "evidence"]
    context_size: Count | None = None
    parallel: Count | None = None
    detail: Annotated[str, Field(max_length=300)] = ""


class ServiceTemplate(WireModel):
    """What every replica of one generation runs; a rollout replaces it."""

    artifact: ResolvedArtifact
    profile_id: uuid.UUID
    profile_version: Count
    environment_id: uuid.UUID | None
    max_concurrent: int
    estimate: MemoryEstimate | None = None
    # A template stored before endpoints were declared served the default ones.
    endpoints: Endpoints = Field(default_factory=default_endpoints)


class PlacementReceipt(WireModel):
    """Why a replica went where it went, or why it could not be placed: every node
    considered, counted by the first reason it was ruled out."""

    decided_at: datetime
    outcome: Literal["placed", "unplaceable"]
    node_id: uuid.UUID | None = None
    device_id: str | None = None
    nodes_considered: int
    feasible: int
    rejected: dict[PlacementReason, int] = Field(default_factory=dict)
    needs_bytes: int | None = None
    # The most free memory on a device that passed every other filter.
    best_free_bytes: int | None = None
    # The chosen candidate's score, by term (fit, artifact, evidence, spread).
    score: dict[str, float] = Field(default_factory=dict)
    holds_artifact: bool = False
    message: ReceiptText


class ReplicaFailure(WireModel):
    code: str
    detail: str = ""


class ReplicaView(WireModel):
    id: uuid.UUID
    service_id: uuid.UUID
    generation: int
    node_id: uuid.UUID
    device_id: str
    phase: ReplicaPhase
    artifact_job_id: uuid.UUID | None
    deployment_id: uuid.UUID | None
    receipt: PlacementReceipt | None
    failure: ReplicaFailure | None
    # Why it ended (drained as surplus, replaced, failed, ...).
    ended_reason: str | None
    created_at: datetime
    phase_changed_at: datetime


class RolloutView(WireModel):
    state: RolloutState
    generation: int
    # Replicas of the current generation that are ready, out of those desired.
    updated_ready: int
    desired: int
    # Replicas of older generations still live.
    outdated: int
    reason: str | None = None
    started_at: datetime | None = None


class ServiceView(WireModel):
    id: uuid.UUID
    name: str
    roles: list[str]
    state: ServiceState
    template: ServiceTemplate
    generation: int
    replicas: int
    ready_replicas: int
    autoscale: Autoscale | None
    placement: Placement
    strategy: UpdateStrategy
    rollout: RolloutView
    # The last placement decision (placed or not), with its reasons.
    last_receipt: PlacementReceipt | None
    created_at: datetime
    updated_at: datetime


class ServiceDetail(ServiceView):
    """GET …/services/{id}: the service and its live replicas (ended ones with ?ended)."""

    items: list[ReplicaView]


class ServiceList(WireModel):
    items: list[ServiceView]


class ServiceEvent(WireModel):
    """A service created, scaled, rolled out, deleted, or one of its replicas placed,
    moved or ended, or a replica that could not be placed (the receipt says why)."""

    service_id: uuid.UUID
    name: str
    action: str
    replicas: int | None = None
    generation: int | None = None
    replica_id: uuid.UUID | None = None
    node_id: uuid.UUID | None = None
    phase: str | None = None
    reason: str | None = None
    receipt: PlacementReceipt | None = None
