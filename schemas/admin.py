"""Administrative API under /api/v1/admin: tokens, nodes, credentials, decommission, audit."""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, Strict

from schemas.agent import GpuTelemetry, HostFacts, NotAppliedReason, StorageTelemetry
from schemas.base import (
    CountParam,
    FilterText,
    Flag,
    Labels,
    Name,
    Note,
    PositiveParam,
    Timestamp,
    WireModel,
    json_integer,
)
from schemas.deployments import DeploymentState
from schemas.jobs import JobKind, JobState

# A node list filter: ``key=value`` matches a label's value, a bare ``key`` its presence.
LabelFilter = Annotated[
    str,
    Field(max_length=127, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}(=[A-Za-z0-9_.-]{0,63})?$"),
]
# Page sizes of the list routes.
PageLimit = Annotated[CountParam, Field(ge=1, le=1000)]


class Liveness(StrEnum):
    ONLINE = "online"
    STALE = "stale"
    OFFLINE = "offline"
    DISABLED = "disabled"
    DECOMMISSIONED = "decommissioned"


class TokenState(StrEnum):
    ACTIVE = "active"
    USED = "used"
    EXPIRED = "expired"
    REVOKED = "revoked"


class CreateEnrollmentToken(WireModel):
    expires_in_s: (
        Annotated[int, Strict(), Field(gt=0, le=365 * 24 * 3600), BeforeValidator(json_integer)]
        | None
    ) = None
    labels: Labels = Field(default_factory=dict)
    display_name: Name | None = None
    note: Note | None = None
    # Recovery: the token re-binds this existing identity instead of creating a node.
    node_id: uuid.UUID | None = None


class EnrollmentTokenInfo(WireModel):
    id: uuid.UUID
    state: TokenState
    created_at: datetime
    expires_at: datetime | None
    labels: dict[str, str]
    display_name: str | None
    note: str | None
    node_id: uuid.UUID | None
    used_at: datetime | None
    used_by_node_id: uuid.UUID | None
    revoked_at: datetime | None


class EnrollmentTokenCreated(WireModel):
    token: EnrollmentTokenInfo
    # Shown exactly once.
    secret: str


class EnrollmentTokenList(WireModel):
    items: list[EnrollmentTokenInfo]


class StreamState(WireModel):
    """One ingest stream (inventory or telemetry) of a node."""

    cursor: int
    good_sequence: int | None
    good_observed_at: datetime | None
    good_received_at: datetime | None
    not_applied_reason: NotAppliedReason | None
    not_applied_sequence: int | None
    not_applied_observed_at: datetime | None
    not_applied_received_at: datetime | None


class GpuInfo(WireModel):
    uuid: str
    index: int
    name: str
    pci_bus_id: str
    memory_total_bytes: int
    driver_version: str | None
    cuda_version: str | None
    first_seen_at: datetime
    last_seen_at: datetime
    missing: bool
    missing_since: datetime | None


class InventoryView(WireModel):
    complete: bool
    host: HostFacts


class TelemetryView(WireModel):
    ram_total_bytes: int
    ram_used_bytes: int
    storage: list[StorageTelemetry]
    gpus: list[GpuTelemetry]


class NodeSummary(WireModel):
    id: uuid.UUID
    hostname: str
    display_name: str | None
    labels: dict[str, str]
    enabled: bool
    liveness: Liveness
    agent_version: str
    protocol_version: int
    enrolled_at: datetime
    last_heartbeat_at: datetime | None
    decommissioned_at: datetime | None


class NodeDetail(NodeSummary):
    capabilities: list[str]
    has_active_credential: bool
    inventory: InventoryView | None
    inventory_stream: StreamState | None
    telemetry: TelemetryView | None
    telemetry_stream: StreamState | None
    gpus: list[GpuInfo]


class NodeList(WireModel):
    items: list[NodeSummary]


class NodePatch(WireModel):
    display_name: Name | None = None
    # Replaces the whole label set.
    labels: Labels | None = None
    enabled: Flag | None = None


class CredentialRevoked(WireModel):
    node_id: uuid.UUID
    revoked_credential_ids: list[uuid.UUID]


class CredentialRotated(WireModel):
    node_id: uuid.UUID
    credential_id: uuid.UUID
    # Shown exactly once: install it in the agent's protected state file.
    credential: str
    revoked_credential_ids: list[uuid.UUID]


# The sha256 of a decommission plan, in hex (store/decommission.py: plan_hash).
PlanHash = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class DecommissionJob(WireModel):
    """A job of the node that a decommission cancels."""

    id: uuid.UUID
    kind: JobKind
    state: JobState
    # Bumped by every claim: a job claimed after the preview changes the plan.
    lease_epoch: int


class DecommissionDeployment(WireModel):
    """A deployment on the node that a decommission ends (unloaded: nothing can reach
    the node through the protocol any more)."""

    id: uuid.UUID
    model: str
    device_id: str
    state: DeploymentState


class DecommissionPreview(WireModel):
    """What executing would do now, and its `plan_hash`: execute takes the hash and
    refuses (409 decommission_plan_changed) when the plan is no longer this one."""

    node_id: uuid.UUID
    already_decommissioned: bool
    credentials_to_revoke: list[uuid.UUID]
    enrollment_tokens_to_revoke: list[uuid.UUID]
    jobs_to_cancel: list[DecommissionJob]
    deployments_to_unload: list[DecommissionDeployment]
    plan_hash: PlanHash
    # Shown for the operator's judgement; not part of the plan (a decommission does
    # nothing to them, and liveness moves on its own).
    gpus: int
    liveness: Liveness


class DecommissionRequest(WireModel):
    # Must repeat the node id: a guard against decommissioning the wrong node.
    confirm_node_id: uuid.UUID
    # The preview's: what the operator looked at is what is done, or nothing is.
    plan_hash: PlanHash
    reason: Annotated[Note, Field(min_length=1)]


class DecommissionResult(WireModel):
    node_id: uuid.UUID
    decommissioned_at: datetime
    revoked_credential_ids: list[uuid.UUID]
    revoked_enrollment_token_ids: list[uuid.UUID]
    cancelled_job_ids: list[uuid.UUID]
    unloaded_deployment_ids: list[uuid.UUID]


class AuditRecord(WireModel):
    id: int
    at: datetime
    actor: str
    action: str
    target_type: str
    target_id: str
    correlation_id: str | None
    details: dict[str, Any]


class AuditList(WireModel):
    items: list[AuditRecord]
    # Pass as before_id to read the next (older) page.
    next_before_id: int | None


# The job kinds whose rows are health checks, not changes: a ready deployment's periodic
# deployment.health.v1 (store/deployments/reconcile.py) and a device's runtime.health.v1.
AUDIT_HEALTH_CHECK_KINDS: tuple[str, ...] = (
    JobKind.DEPLOYMENT_HEALTH.value,
    JobKind.RUNTIME_HEALTH.value,
)


class AuditQuery(WireModel):
    """Query parameters of the audit log (text on the wire, hence the *Param integers)."""

    actor: FilterText | None = None
    action: FilterText | None = None
    # The action's family, its first part: "node" matches node.enrolled, node.gpu.added...
    kind: FilterText | None = None
    # Every row about the node: its own events and those whose details name it (its jobs,
    # deployments, replicas).
    node_id: uuid.UUID | None = None
    # The periodic health-check jobs' rows (AUDIT_HEALTH_CHECK_KINDS) are left out unless
    # asked for: a fleet's deployments write three every few seconds each.
    health_checks: bool = False
    target_type: FilterText | None = None
    target_id: FilterText | None = None
    correlation_id: FilterText | None = None
    since: Timestamp | None = None
    until: Timestamp | None = None
    before_id: PositiveParam | None = None
    limit: PageLimit = 100


class DeadLetterInfo(WireModel):
    """A worker message that will not run again on its own."""

    seq: int
    queue: str
    actor_name: str | None
    message_id: str
    # failed (retries exhausted), max_deliveries (crash loop) or undecodable.
    reason: str
    exception_type: str
    error: str
    retries: int
    deliveries: int
    failed_at: datetime


class DeadLetterList(WireModel):
    items: list[DeadLetterInfo]
    # Pass as after_seq to read the next page.
    next_seq: int | None


class DeadLetterReplayed(WireModel):
    seq: int
    queue: str
    message_id: str


class FleetIncidentInfo(WireModel):
    id: uuid.UUID
    kind: str
    opened_at: datetime
    watched_nodes: int
    silent_nodes: int
    acknowledged_at: datetime | None
    acknowledged_reason: str | None
    resolved_at: datetime | None


class FleetIncidentList(WireModel):
    items: list[FleetIncidentInfo]


class AcknowledgeIncident(WireModel):
    # Why the operator believes the silent nodes are really gone (audited).
    reason: Annotated[Note, Field(min_length=1)]


class ApiPresence(WireModel):
    last_seen_at: datetime
    # The last recorded span with no API; equal when there never was one.
    down_since: datetime
    resumed_at: datetime


class FleetSafety(WireModel):
    """The fleet-level guards: is the partition breaker holding offline transitions?"""

    partition_hold: bool
    open_incident: FleetIncidentInfo | None
    api_presence: ApiPresence | None
