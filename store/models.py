"""Tables. PostgreSQL is the source of truth for identity, cursors and last-good state.

Secrets never appear here: tokens and credentials are stored as SHA-256 digests of
256-bit random values (a slow KDF buys nothing for values with that much entropy).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    Identity,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    type_annotation_map = {
        datetime: DateTime(timezone=True),
        uuid.UUID: UUID(as_uuid=True),
        dict[str, Any]: JSONB,
        dict[str, str]: JSONB,
        list[str]: JSONB,
    }


class EnrollmentToken(Base):
    __tablename__ = "enrollment_tokens"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    digest: Mapped[bytes] = mapped_column(LargeBinary(32))
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    expires_at: Mapped[datetime | None]
    # Labels and display name the enrolled node starts with.
    labels: Mapped[dict[str, str]] = mapped_column(server_default=text("'{}'::jsonb"))
    display_name: Mapped[str | None] = mapped_column(String(200))
    note: Mapped[str | None] = mapped_column(String(500))
    # Set for a recovery token that re-binds an existing identity.
    node_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("nodes.id"))
    used_at: Mapped[datetime | None]
    used_by_node_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("nodes.id"))
    revoked_at: Mapped[datetime | None]


class Node(Base):
    __tablename__ = "nodes"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    hostname: Mapped[str] = mapped_column(String(255))
    display_name: Mapped[str | None] = mapped_column(String(200))
    labels: Mapped[dict[str, str]] = mapped_column(server_default=text("'{}'::jsonb"))
    enabled: Mapped[bool] = mapped_column(Boolean, server_default=text("true"))
    protocol_version: Mapped[int] = mapped_column(Integer)
    agent_version: Mapped[str] = mapped_column(String(100))
    capabilities: Mapped[list[str]] = mapped_column(server_default=text("'[]'::jsonb"))
    enrolled_at: Mapped[datetime] = mapped_column(server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())
    # Server-received time of the last accepted heartbeat: the only input to liveness.
    last_heartbeat_at: Mapped[datetime | None]
    # Recorded liveness (online/stale/offline) as last decided by a sweep or a
    # heartbeat; transitions are events. Reads still compute it from the timestamp.
    liveness: Mapped[str] = mapped_column(String(16), server_default=text("'offline'"))
    liveness_changed_at: Mapped[datetime | None]
    decommissioned_at: Mapped[datetime | None]
    decommission_reason: Mapped[str | None] = mapped_column(String(500))

    __table_args__ = (Index("ix_nodes_labels", "labels", postgresql_using="gin"),)


class NodeCredential(Base):
    __tablename__ = "node_credentials"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    node_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("nodes.id"))
    digest: Mapped[bytes] = mapped_column(LargeBinary(32))
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    revoked_at: Mapped[datetime | None]
    revoked_reason: Mapped[str | None] = mapped_column(String(100))

    __table_args__ = (
        # At most one active credential per node, whatever races happen above.
        Index(
            "uq_node_credentials_one_active",
            "node_id",
            unique=True,
            postgresql_where=text("revoked_at IS NULL"),
        ),
    )


class NodeStream(Base):
    """Per-node, per-stream ordering cursor plus the last-good observation."""

    __tablename__ = "node_streams"

    node_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("nodes.id"), primary_key=True)
    stream: Mapped[str] = mapped_column(String(32), primary_key=True)
    cursor: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    good_sequence: Mapped[int | None] = mapped_column(BigInteger)
    good_observed_at: Mapped[datetime | None]
    good_received_at: Mapped[datetime | None]
    good_payload: Mapped[dict[str, Any] | None]
    # Why the newest sample was not applied; cleared by the next good one.
    not_applied_reason: Mapped[str | None] = mapped_column(String(64))
    not_applied_sequence: Mapped[int | None] = mapped_column(BigInteger)
    not_applied_observed_at: Mapped[datetime | None]
    not_applied_received_at: Mapped[datetime | None]


class Gpu(Base):
    __tablename__ = "gpus"

    node_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("nodes.id"), primary_key=True)
    uuid: Mapped[str] = mapped_column(String(128), primary_key=True)
    index: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(200))
    pci_bus_id: Mapped[str] = mapped_column(String(64))
    memory_total_bytes: Mapped[int] = mapped_column(BigInteger)
    driver_version: Mapped[str | None] = mapped_column(String(64))
    cuda_version: Mapped[str | None] = mapped_column(String(64))
    first_seen_at: Mapped[datetime] = mapped_column(server_default=func.now())
    last_seen_at: Mapped[datetime] = mapped_column(server_default=func.now())
    missing_since: Mapped[datetime | None]


class InventoryObservation(Base):
    """An accepted inventory report that a worker has not reconciled yet.

    The inventory route stores it (and its node.inventory.accepted event) once the
    ordering rules accept it; workers/reconcile.py applies a node's rows in sequence
    order and deletes them. Sequences of one node's accepted reports only increase.
    """

    __tablename__ = "inventory_observations"

    node_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("nodes.id"), primary_key=True)
    sequence: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    received_at: Mapped[datetime]
    # The request's, so the GPU events a worker derives from it share it.
    correlation_id: Mapped[str | None] = mapped_column(String(128))
    report: Mapped[dict[str, Any]]


class AuditEntry(Base):
    """Written only by the audit consumer (workers/audit.py), from the event stream."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    # The CloudEvent this row was written from: at most one row per event, however
    # often the stream delivers it. NULL only for rows written before 0005.
    event_id: Mapped[uuid.UUID | None] = mapped_column(unique=True)
    # When the change happened (the event's time), not when the row was written.
    at: Mapped[datetime] = mapped_column(server_default=func.now())
    # When the audit consumer wrote it: recorded_at - at is the log's lag.
    recorded_at: Mapped[datetime] = mapped_column(server_default=func.now())
    actor: Mapped[str] = mapped_column(String(100))
    action: Mapped[str] = mapped_column(String(100))
    target_type: Mapped[str] = mapped_column(String(50))
    target_id: Mapped[str] = mapped_column(String(200))
    correlation_id: Mapped[str | None] = mapped_column(String(128))
    details: Mapped[dict[str, Any]] = mapped_column(server_default=text("'{}'::jsonb"))

    __table_args__ = (
        Index("ix_audit_log_at", "at"),
        Index("ix_audit_log_target", "target_type", "target_id"),
    )


class OutboxEvent(Base):
    """A CloudEvent written in the same transaction as the change it describes."""

    __tablename__ = "outbox"

    # Monotonic insertion order: the relay publishes in this order, which keeps
    # every node's events in order on the stream.
    position: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    id: Mapped[uuid.UUID] = mapped_column(unique=True)
    subject: Mapped[str] = mapped_column(Text)
    envelope: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    sent_at: Mapped[datetime | None]

    __table_args__ = (
        Index("ix_outbox_unsent", "position", postgresql_where=text("sent_at IS NULL")),
    )


class ControlPlanePresence(Base):
    """When a control-plane component (the API) was last seen, and its last outage.

    Every API process refreshes the one "api" row every second. A refresh that finds
    the row older than the presence gap records an outage: [down_since, resumed_at].
    Node silence during that outage is not the nodes' fault, so liveness shifts each
    node's last heartbeat by the outage's length (store/liveness.py).
    """

    __tablename__ = "control_plane_presence"

    component: Mapped[str] = mapped_column(String(32), primary_key=True)
    last_seen_at: Mapped[datetime]
    down_since: Mapped[datetime]
    resumed_at: Mapped[datetime]
    # The last time an API process reported that it shed load (api/shedding.py): the
    # sweepers record no liveness change for a stale threshold after it.
    shed_at: Mapped[datetime | None]


class UiSessionRevocation(Base):
    """A dashboard session ended by logout (api/ui/session.py), until it would have
    expired anyway: every API process refuses its cookie, those started later too."""

    __tablename__ = "ui_session_revocations"

    nonce: Mapped[str] = mapped_column(String(64), primary_key=True)
    expires_at: Mapped[datetime]


class UiLoginFailure(Base):
    """A wrong operator key at the dashboard's login, from one client address
    (store/ui_logins.py): every API process counts the same rows."""

    __tablename__ = "ui_login_failures"
    __table_args__ = (
        Index("ix_ui_login_failures_client_failed_at", "client", "failed_at"),
        Index("ix_ui_login_failures_failed_at", "failed_at"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    client: Mapped[str] = mapped_column(Text)
    failed_at: Mapped[datetime]


class FleetIncident(Base):
    """A fleet-level condition the sweeper detected, e.g. a suspected partition."""

    __tablename__ = "fleet_incidents"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(64))
    opened_at: Mapped[datetime]
    # What the breaker saw when it tripped.
    silent_nodes: Mapped[int] = mapped_column(Integer)
    watched_nodes: Mapped[int] = mapped_column(Integer)
    acknowledged_at: Mapped[datetime | None]
    acknowledged_reason: Mapped[str | None] = mapped_column(String(500))
    resolved_at: Mapped[datetime | None]

    __table_args__ = (
        # One open incident of a kind, however many sweepers trip at once.
        Index(
            "uq_fleet_incidents_one_open",
            "kind",
            unique=True,
            postgresql_where=text("resolved_at IS NULL"),
        ),
    )


class Job(Base):
    """Work handed to one node under a lease (store/leases.py); `kind` says what `spec`
    holds (schemas/jobs.py: JobKind). One table for every kind: claim, fence, extend and
    expire are the same for all of them."""

    __tablename__ = "jobs"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(64))
    node_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("nodes.id"))
    state: Mapped[str] = mapped_column(String(16))
    spec: Mapped[dict[str, Any]]
    attempt: Mapped[int] = mapped_column(Integer, server_default="0")
    max_attempts: Mapped[int] = mapped_column(Integer)
    # Claimable from this time on (a retry waits out its backoff).
    available_at: Mapped[datetime]
    lease_id: Mapped[uuid.UUID | None]
    # The fencing value: +1 on every claim; reports must carry the current one.
    lease_epoch: Mapped[int] = mapped_column(BigInteger, server_default="0")
    lease_expires_at: Mapped[datetime | None]
    cancel_requested_at: Mapped[datetime | None]
    progress: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    # What a completed job established, typed per kind (store/results.py).
    result: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    failure_code: Mapped[str | None] = mapped_column(String(64))
    failure_retryable: Mapped[bool | None] = mapped_column(Boolean)
    failure_detail: Mapped[str | None] = mapped_column(String(500))
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]

    __table_args__ = (
        # The claim: a node's queued jobs of one kind, oldest first.
        Index(
            "ix_jobs_claimable",
            "node_id",
            "kind",
            "available_at",
            postgresql_where=text("state = 'queued'"),
        ),
        # The expiry sweep: leases by expiry.
        Index("ix_jobs_leased", "lease_expires_at", postgresql_where=text("state = 'leased'")),
        Index("ix_jobs_created", "created_at", "id"),
    )


class NodeArtifact(Base):
    """Where an artifact is: the node's artifact inventory, written when an acquisition
    job completes with a verified file list."""

    __tablename__ = "node_artifacts"

    node_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("nodes.id"), primary_key=True)
    root: Mapped[str] = mapped_column(String(1024), primary_key=True)
    repository: Mapped[str] = mapped_column(String(200), primary_key=True)
    commit: Mapped[str] = mapped_column(String(40), primary_key=True)
    files: Mapped[list[dict[str, Any]]] = mapped_column(JSONB)
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id"))
    recorded_at: Mapped[datetime]
