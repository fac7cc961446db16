"""The services and service_replicas tables (migration 0017)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, Index, Integer, String, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from store.models import Base


class Service(Base):
    """A model served by N replicas (schemas/services.py). One reconciler at a time moves
    a service: it holds the row's lock (FOR UPDATE SKIP LOCKED) for the whole step, so two
    workers never place the same replica."""

    __tablename__ = "services"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    # The served model name: unique among services not deleted (a partial index).
    name: Mapped[str] = mapped_column(String(128))
    roles: Mapped[list[str]] = mapped_column(JSONB)
    state: Mapped[str] = mapped_column(String(16))
    # schemas/services.py: ServiceTemplate, the current one and the one before (undo).
    template: Mapped[dict[str, Any]] = mapped_column(JSONB)
    previous_template: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    # The current template's endpoints (migration 0020), for the gateway's reads.
    endpoints: Mapped[list[str]] = mapped_column(
        JSONB, server_default=text('\'["chat", "completions"]\'::jsonb')
    )
    # The generation the previous template ran as: an undo gives its live replicas the
    # new generation number instead of replacing replicas that already run it.
    previous_generation: Mapped[int | None] = mapped_column(Integer)
    # Moves with every new template; a replica runs the generation it was placed for.
    generation: Mapped[int] = mapped_column(Integer)
    replicas: Mapped[int] = mapped_column(Integer)
    autoscale: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    placement: Mapped[dict[str, Any]] = mapped_column(JSONB)
    strategy: Mapped[dict[str, Any]] = mapped_column(JSONB)
    rollout_state: Mapped[str] = mapped_column(String(16))
    rollout_reason: Mapped[str | None] = mapped_column(String(300))
    rollout_started_at: Mapped[datetime | None]
    # schemas/services.py: PlacementReceipt, the last decision.
    last_receipt: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    # Node id → until when the scheduler avoids it for this service (a failed acquisition
    # or load there), and how many times it failed there.
    backoff: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    # Autoscale's last change (its cooldown counts from here).
    scaled_at: Mapped[datetime | None]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]

    __table_args__ = (
        Index(
            "ux_services_live_name",
            "name",
            unique=True,
            postgresql_where=text("state <> 'deleted'"),
        ),
    )


class ServiceReplica(Base):
    """One replica: a node's device, the artifact job that brings the file there (when it
    lacked it) and the deployment that serves it."""

    __tablename__ = "service_replicas"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    service_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("services.id"))
    generation: Mapped[int] = mapped_column(Integer)
    node_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("nodes.id"))
    device_id: Mapped[str] = mapped_column(String(16))
    phase: Mapped[str] = mapped_column(String(16))
    artifact_job_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("jobs.id"))
    deployment_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("deployments.id"))
    receipt: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    failure_code: Mapped[str | None] = mapped_column(String(64))
    failure_detail: Mapped[str | None] = mapped_column(String(500))
    ended_reason: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    phase_changed_at: Mapped[datetime]

    __table_args__ = (
        Index("ix_service_replicas_service", "service_id", "phase"),
        # A device holds one live replica, whatever the service: the scheduler reads it,
        # and the index refuses a second one a racing decision might still write.
        Index(
            "ux_service_replicas_live_device",
            "node_id",
            "device_id",
            unique=True,
            postgresql_where=text("phase <> 'ended'"),
        ),
    )
