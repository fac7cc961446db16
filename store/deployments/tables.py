"""The deployments table (migrations 0010, 0020) and the runtime channels a deployment's
availability is read from (migration 0016); service clients have their own module
(store/deployments/service_client_tables.py)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Float, ForeignKey, Integer, String, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from store.models import Base


class Deployment(Base):
    """An artifact served on one node's device (store/deployments/rules.py moves it)."""

    __tablename__ = "deployments"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    model: Mapped[str] = mapped_column(String(128))
    roles: Mapped[list[str]] = mapped_column(JSONB)
    # What it serves (migration 0020): chat, completions, embeddings.
    endpoints: Mapped[list[str]] = mapped_column(
        JSONB, server_default=text('\'["chat", "completions"]\'::jsonb')
    )
    # What its chat template can do, as its node reported at its last load
    # (schemas/endpoints.py: ChatTemplateCaps); None until then.
    capabilities: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    node_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("nodes.id"))
    device_id: Mapped[str] = mapped_column(String(16))
    artifact: Mapped[dict[str, Any]] = mapped_column(JSONB)
    profile_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("runtime_profiles.id"))
    profile_version: Mapped[int] = mapped_column(Integer)
    environment_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("runtime_environments.id"))
    # The resolved deployment.load.v1 spec (schemas/deployments.py: LoadSpec).
    spec: Mapped[dict[str, Any]] = mapped_column(JSONB)
    state: Mapped[str] = mapped_column(String(16))
    max_concurrent: Mapped[int] = mapped_column(Integer)
    max_attempts: Mapped[int] = mapped_column(Integer)
    failure_code: Mapped[str | None] = mapped_column(String(64))
    failure_detail: Mapped[str | None] = mapped_column(String(500))
    queue_depth: Mapped[int | None] = mapped_column(Integer)
    cooldown_until: Mapped[datetime | None]
    cooldown_reason: Mapped[str | None] = mapped_column(String(200))
    drain_deadline_s: Mapped[float | None] = mapped_column(Float)
    # The job moving it now, or the last one that did.
    job_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("jobs.id"))
    # When the next deployment.health.v1 is due (ready deployments).
    health_due_at: Mapped[datetime | None]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    state_changed_at: Mapped[datetime]


class RuntimeChannel(Base):
    """A node's runtime channel, as the API process holding it last wrote it
    (store/deployments/runtime_channels.py): one row per node, the newest channel's."""

    __tablename__ = "runtime_channels"

    node_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("nodes.id"), primary_key=True)
    channel_id: Mapped[uuid.UUID]
    opened_at: Mapped[datetime]
    # Past this the channel counts as gone: a keep-alive moves it on, the channel's end
    # brings it close, an API process that died leaves it to pass.
    expires_at: Mapped[datetime]
    closed_at: Mapped[datetime | None]
