"""CloudEvents 1.0 envelopes and the payload of every event ModelForge publishes.

Subjects: ``modelforge.v1.node.<node_id>.<event>`` for node events and
``modelforge.v1.token.<token_id>.<event>`` for enrollment tokens, so a consumer can
filter one node (``modelforge.v1.node.<id>.>``) or one kind of event
(``modelforge.v1.node.*.gpu.missing``).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import Field

from schemas.base import WireModel
from schemas.services import ServiceEvent

EVENT_SOURCE = "/modelforge/control-plane"
SUBJECT_PREFIX = "modelforge.v1"


class EventType(StrEnum):
    TOKEN_CREATED = "token.created"
    TOKEN_REVOKED = "token.revoked"
    NODE_ENROLLED = "node.enrolled"
    NODE_UPDATED = "node.updated"
    NODE_DISABLED = "node.disabled"
    NODE_ENABLED = "node.enabled"
    NODE_AGENT_CHANGED = "node.agent.changed"
    NODE_CREDENTIAL_REVOKED = "node.credential.revoked"
    NODE_CREDENTIAL_ROTATED = "node.credential.rotated"
    NODE_DECOMMISSIONED = "node.decommissioned"
    NODE_STREAM_NOT_APPLIED = "node.stream.not_applied"
    NODE_INVENTORY_ACCEPTED = "node.inventory.accepted"
    NODE_LIVENESS_CHANGED = "node.liveness.changed"
    GPU_ADDED = "node.gpu.added"
    GPU_MISSING = "node.gpu.missing"
    GPU_RETURNED = "node.gpu.returned"
    GPU_CHANGED = "node.gpu.changed"
    FLEET_PARTITION_SUSPECTED = "fleet.partition_suspected"
    FLEET_PARTITION_ACKNOWLEDGED = "fleet.partition_acknowledged"
    FLEET_PARTITION_RESOLVED = "fleet.partition_resolved"
    JOB_CREATED = "job.created"
    JOB_CLAIMED = "job.claimed"
    JOB_PROGRESSED = "job.progressed"
    JOB_COMPLETED = "job.completed"
    JOB_FAILED = "job.failed"
    JOB_RETRY_SCHEDULED = "job.retry_scheduled"
    JOB_CANCEL_REQUESTED = "job.cancel_requested"
    JOB_CANCELLED = "job.cancelled"
    JOB_EXPIRED = "job.expired"
    RUNTIME_PROFILE_CREATED = "runtime.profile_created"
    DEPLOYMENT_CREATED = "deployment.created"
    # Every lifecycle transition (schemas/deployments.py: DeploymentState).
    DEPLOYMENT_STATE_CHANGED = "deployment.state_changed"
    SERVICE_CREATED = "service.created"
    # Scaled (by an operator or autoscale), rolled out, undone, stopped, deleted: `action`.
    SERVICE_CHANGED = "service.changed"
    # A replica placed, moved through its phases, or ended.
    SERVICE_REPLICA_CHANGED = "service.replica_changed"
    # A replica the scheduler could not place; its receipt counts the reasons.
    SERVICE_UNPLACEABLE = "service.unplaceable"
    SERVICE_CLIENT_CREATED = "service_client.created"
    SERVICE_CLIENT_ROTATED = "service_client.rotated"
    SERVICE_CLIENT_REVOKED = "service_client.revoked"

    @property
    def cloudevent_type(self) -> str:
        return f"io.modelforge.{self.value}.v1"

    def subject(self, target_id: uuid.UUID) -> str:
        kind, _, rest = self.value.partition(".")
        return f"{SUBJECT_PREFIX}.{kind}.{target_id}.{rest}"


def subject_filter(node_id: str | None = None, event_type: EventType | None = None) -> str:
    """The NATS subject filter for one node, one event type, both, or everything."""
    if event_type is None:
        return f"{SUBJECT_PREFIX}.node.{node_id}.>" if node_id else f"{SUBJECT_PREFIX}.>"
    kind, _, rest = event_type.value.partition(".")
    if node_id and kind != "node":
        raise ValueError(f"{event_type.value} events are not about a node")
    return f"{SUBJECT_PREFIX}.{kind}.{node_id or '*'}.{rest}"


# What the id in each subject kind names, and the audit target type it stands for.
SUBJECT_IDS: dict[str, str] = {
    "node": "node_id",
    "token": "token_id",
    "fleet": "incident_id",
    "job": "job_id",
    "runtime": "profile_id",
    "deployment": "deployment_id",
    "service_client": "client_id",
    "service": "service_id",
}
TARGET_TYPES: dict[str, str] = {
    "node": "node",
    "token": "enrollment_token",
    "fleet": "fleet_incident",
    "job": "job",
    "runtime": "runtime_profile",
    "deployment": "deployment",
    "service_client": "service_client",
    "service": "service",
}

# Who made a change: the operator (admin API), a node (its own credential), or a worker
# deciding by itself (`worker:<job>`, e.g. `worker:liveness`).
OPERATOR_ACTOR = "operator"


def node_actor(node_id: object) -> str:
    return f"node:{node_id}"


def worker_actor(job: str) -> str:
    return f"worker:{job}"


class CloudEvent(WireModel):
    """Structured-mode CloudEvents 1.0 JSON, exactly as it sits on the stream.

    Complete enough to audit from: the audit log is written from these envelopes alone
    (workers/audit.py), so every one names who did what to which object, and why (the
    correlation id of the request or message that caused it).
    """

    specversion: Literal["1.0"] = "1.0"
    id: uuid.UUID
    source: str = EVENT_SOURCE
    type: str
    subject: str
    time: datetime
    datacontenttype: Literal["application/json"] = "application/json"
    # Extension attributes (lowercase alphanumerics, per the spec).
    correlationid: str | None = None
    nodeid: uuid.UUID | None = None
    actor: str
    # The EventType value (e.g. "node.enrolled"): the audit log's action.
    action: str
    # What changed: a TARGET_TYPES value or "gpu", and its id ("<node_id>/<gpu uuid>").
    targettype: str
    targetid: str
    data: dict[str, Any]


class TokenCreated(WireModel):
    token_id: uuid.UUID
    expires_at: datetime | None
    labels: dict[str, str]
    node_id: uuid.UUID | None


class TokenRevoked(WireModel):
    token_id: uuid.UUID
    reason: str


class NodeEnrolled(WireModel):
    node_id: uuid.UUID
    hostname: str
    agent_version: str
    protocol_version: int
    capabilities: list[str]
    labels: dict[str, str]
    token_id: uuid.UUID
    credential_id: uuid.UUID
    # True when a recovery token re-bound an existing identity.
    rebound: bool


class NodeUpdated(WireModel):
    node_id: uuid.UUID
    changes: dict[str, Any]


class NodeEnablementChanged(WireModel):
    node_id: uuid.UUID
    enabled: bool


class NodeAgentChanged(WireModel):
    node_id: uuid.UUID
    agent_version: str
    protocol_version: int
    capabilities: list[str]
    previous_agent_version: str
    previous_capabilities: list[str]


class CredentialRevokedEvent(WireModel):
    node_id: uuid.UUID
    credential_ids: list[uuid.UUID]
    reason: str


class CredentialRotatedEvent(WireModel):
    node_id: uuid.UUID
    credential_id: uuid.UUID
    revoked_credential_ids: list[uuid.UUID]


class NodeDecommissioned(WireModel):
    node_id: uuid.UUID
    reason: str
    revoked_credential_ids: list[uuid.UUID]
    # Unused recovery tokens bound to the node, revoked with it.
    revoked_enrollment_token_ids: list[uuid.UUID]


class StreamNotApplied(WireModel):
    """Emitted when a stream starts refusing samples, not for every refused sample."""

    node_id: uuid.UUID
    stream: str
    sequence: int
    reason: str
    observed_at: datetime
    received_at: datetime


class InventoryAccepted(WireModel):
    """An inventory report passed the ordering rules and waits for reconciliation
    (GPU added/changed/missing/returned), which a worker does from the stored report."""

    node_id: uuid.UUID
    sequence: int
    observed_at: datetime
    received_at: datetime
    complete: bool
    gpu_count: int


class LivenessChanged(WireModel):
    """A recorded transition between online, stale and offline."""

    node_id: uuid.UUID
    previous: str
    current: str
    # Server-received time of the last heartbeat: what the decision was made from.
    last_heartbeat_at: datetime | None
    # "sweep" (a worker saw a threshold pass) or "heartbeat" (the node came back).
    decided_by: Literal["sweep", "heartbeat"]


class GpuEvent(WireModel):
    node_id: uuid.UUID
    gpu_uuid: str
    index: int
    name: str
    pci_bus_id: str
    # Field -> [old, new], only for node.gpu.changed.
    changes: dict[str, list[Any]] = Field(default_factory=dict)


class PartitionSuspected(WireModel):
    """The breaker tripped: offline transitions are held until it resolves or an
    operator acknowledges it."""

    incident_id: uuid.UUID
    # Nodes recorded online or stale, and how many of them have gone silent.
    watched_nodes: int
    silent_nodes: int
    # The share of watched nodes above which the breaker trips.
    threshold: float


class PartitionAcknowledged(WireModel):
    incident_id: uuid.UUID
    reason: str


class PartitionResolved(WireModel):
    incident_id: uuid.UUID
    watched_nodes: int
    silent_nodes: int
    acknowledged: bool


class JobEvent(WireModel):
    """A job's lifecycle (schemas/jobs.py). Subjects are ``modelforge.v1.job.<job_id>.<event>``;
    `node_id` (also the envelope's `nodeid`) says whose job it is, which is what the API's
    notification relay routes by."""

    job_id: uuid.UUID
    node_id: uuid.UUID
    kind: str
    state: str
    attempt: int
    # The lease, once claimed.
    epoch: int | None = None
    lease_expires_at: datetime | None = None
    # job.failed / job.retry_scheduled / job.expired: why, and when the next attempt may run.
    failure_code: str | None = None
    retryable: bool | None = None
    retry_at: datetime | None = None
    # job.progressed: the milestone crossed (25, 50, 75 per cent of the bytes).
    percent: int | None = None


class DeploymentEvent(WireModel):
    """A deployment created, or moved from one state to another (`previous`), and why
    (a failure code, `node_offline`, `operator`, ...)."""

    deployment_id: uuid.UUID
    node_id: uuid.UUID
    model: str
    state: str
    previous: str | None = None
    reason: str | None = None


class ServiceClientEvent(WireModel):
    client_id: uuid.UUID
    name: str


class RuntimeProfileCreated(WireModel):
    """A new immutable version of a runtime profile (a change is always a new version)."""

    profile_id: uuid.UUID
    name: str
    version: int


EVENT_MEANINGS: dict[EventType, str] = {
    EventType.TOKEN_CREATED: "an operator created an enrollment token",
    EventType.TOKEN_REVOKED: "an enrollment token was revoked before use",
    EventType.NODE_ENROLLED: "a token became a node identity (or re-bound one)",
    EventType.NODE_UPDATED: "display name, labels or hostname changed",
    EventType.NODE_DISABLED: "an operator disabled the node; its agent is refused",
    EventType.NODE_ENABLED: "an operator enabled the node again",
    EventType.NODE_AGENT_CHANGED: "agent version, protocol version or capabilities changed",
    EventType.NODE_CREDENTIAL_REVOKED: "credentials were revoked",
    EventType.NODE_CREDENTIAL_ROTATED: "the credential was replaced",
    EventType.NODE_DECOMMISSIONED: "terminal: the identity is refused everywhere, forever",
    EventType.NODE_STREAM_NOT_APPLIED: "an inventory/telemetry sample was not applied (clock)",
    EventType.NODE_INVENTORY_ACCEPTED: "an inventory report was accepted; GPU events follow "
    "once a worker has reconciled it",
    EventType.NODE_LIVENESS_CHANGED: "online, stale or offline, from server-received time",
    EventType.GPU_ADDED: "a GPU UUID was seen on the node for the first time",
    EventType.GPU_MISSING: "a complete inventory omitted a known GPU",
    EventType.GPU_RETURNED: "a missing GPU was reported again",
    EventType.GPU_CHANGED: "index, PCI bus id, name, memory or versions changed",
    EventType.FLEET_PARTITION_SUSPECTED: "a large share of the fleet went silent at once; "
    "offline transitions are held",
    EventType.FLEET_PARTITION_ACKNOWLEDGED: "an operator released the hold: the silent "
    "nodes go offline",
    EventType.FLEET_PARTITION_RESOLVED: "the silent share fell back; the incident is over",
    EventType.JOB_CREATED: "an operator created a job for a node (a notification: claim it)",
    EventType.JOB_CLAIMED: "the node claimed the job; it holds a lease with a new epoch",
    EventType.JOB_PROGRESSED: "the job crossed 25, 50 or 75 per cent (not every report)",
    EventType.JOB_COMPLETED: "the node reported a verified result that matched the job",
    EventType.JOB_FAILED: "the job failed for good (not retryable, or out of attempts)",
    EventType.JOB_RETRY_SCHEDULED: "an attempt failed or its lease expired; the job is "
    "queued again after a backoff",
    EventType.JOB_CANCEL_REQUESTED: "an operator cancelled a claimed job; the node is told "
    "on its next progress report (a notification)",
    EventType.JOB_CANCELLED: "the job ended cancelled",
    EventType.JOB_EXPIRED: "the lease ran out without a report; a worker took the job back",
    EventType.RUNTIME_PROFILE_CREATED: "an operator created a runtime profile version",
    EventType.DEPLOYMENT_CREATED: "an operator created a deployment (pending)",
    EventType.DEPLOYMENT_STATE_CHANGED: "a deployment moved through its lifecycle",
    EventType.SERVICE_CREATED: "an operator declared a model service",
    EventType.SERVICE_CHANGED: "a service was scaled, rolled out, undone, stopped or deleted",
    EventType.SERVICE_REPLICA_CHANGED: "a service's replica was placed, moved or ended",
    EventType.SERVICE_UNPLACEABLE: "a replica could not be placed; the receipt says why",
    EventType.SERVICE_CLIENT_CREATED: "an operator created a service client",
    EventType.SERVICE_CLIENT_ROTATED: "a service client's secret was replaced",
    EventType.SERVICE_CLIENT_REVOKED: "a service client was revoked",
}

# Events that record no change of state, so the audit log leaves them out: an accepted
# report is work for the workers (the GPU and node events it leads to are audited), and
# a refused sample changed nothing but the cursor.
NOT_AUDITED: frozenset[str] = frozenset(
    {EventType.NODE_INVENTORY_ACCEPTED.value, EventType.NODE_STREAM_NOT_APPLIED.value}
)

EVENT_PAYLOADS: dict[EventType, type[WireModel]] = {
    EventType.TOKEN_CREATED: TokenCreated,
    EventType.TOKEN_REVOKED: TokenRevoked,
    EventType.NODE_ENROLLED: NodeEnrolled,
    EventType.NODE_UPDATED: NodeUpdated,
    EventType.NODE_DISABLED: NodeEnablementChanged,
    EventType.NODE_ENABLED: NodeEnablementChanged,
    EventType.NODE_AGENT_CHANGED: NodeAgentChanged,
    EventType.NODE_CREDENTIAL_REVOKED: CredentialRevokedEvent,
    EventType.NODE_CREDENTIAL_ROTATED: CredentialRotatedEvent,
    EventType.NODE_DECOMMISSIONED: NodeDecommissioned,
    EventType.NODE_STREAM_NOT_APPLIED: StreamNotApplied,
    EventType.NODE_INVENTORY_ACCEPTED: InventoryAccepted,
    EventType.NODE_LIVENESS_CHANGED: LivenessChanged,
    EventType.GPU_ADDED: GpuEvent,
    EventType.GPU_MISSING: GpuEvent,
    EventType.GPU_RETURNED: GpuEvent,
    EventType.GPU_CHANGED: GpuEvent,
    EventType.FLEET_PARTITION_SUSPECTED: PartitionSuspected,
    EventType.FLEET_PARTITION_ACKNOWLEDGED: PartitionAcknowledged,
    EventType.FLEET_PARTITION_RESOLVED: PartitionResolved,
    EventType.JOB_CREATED: JobEvent,
    EventType.JOB_CLAIMED: JobEvent,
    EventType.JOB_PROGRESSED: JobEvent,
    EventType.JOB_COMPLETED: JobEvent,
    EventType.JOB_FAILED: JobEvent,
    EventType.JOB_RETRY_SCHEDULED: JobEvent,
    EventType.JOB_CANCEL_REQUESTED: JobEvent,
    EventType.JOB_CANCELLED: JobEvent,
    EventType.JOB_EXPIRED: JobEvent,
    EventType.RUNTIME_PROFILE_CREATED: RuntimeProfileCreated,
    EventType.DEPLOYMENT_CREATED: DeploymentEvent,
    EventType.DEPLOYMENT_STATE_CHANGED: DeploymentEvent,
    EventType.SERVICE_CREATED: ServiceEvent,
    EventType.SERVICE_CHANGED: ServiceEvent,
    EventType.SERVICE_REPLICA_CHANGED: ServiceEvent,
    EventType.SERVICE_UNPLACEABLE: ServiceEvent,
    EventType.SERVICE_CLIENT_CREATED: ServiceClientEvent,
    EventType.SERVICE_CLIENT_ROTATED: ServiceClientEvent,
    EventType.SERVICE_CLIENT_REVOKED: ServiceClientEvent,
}
