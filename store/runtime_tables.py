"""The runtime's tables (migration 0008): profiles and environments, probe evidence.
(The runtime workers' reports are a node stream, `runtime`, in node_streams.)"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, String
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from store.models import Base


class RuntimeProfile(Base):
    """Immutable: a change is the next version of the same name."""

    __tablename__ = "runtime_profiles"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100))
    version: Mapped[int]
    settings: Mapped[dict[str, Any]] = mapped_column(JSONB)
    created_at: Mapped[datetime]


class RuntimeEnvironment(Base):
    """A llama-server binary, identified by its digest, as a runtime worker reported it."""

    __tablename__ = "runtime_environments"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    binary_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    version: Mapped[str] = mapped_column(String(200))
    backend: Mapped[str] = mapped_column(String(16))
    first_reported_at: Mapped[datetime]
    first_node_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("nodes.id"))


class RuntimeEvidence(Base):
    __tablename__ = "runtime_evidence"

    node_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("nodes.id"), primary_key=True)
    device_id: Mapped[str] = mapped_column(String(16), primary_key=True)
    artifact_digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    profile_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("runtime_profiles.id"), primary_key=True
    )
    environment_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("runtime_environments.id"), primary_key=True
    )
    artifact_path: Mapped[str] = mapped_column(String(2048))
    health: Mapped[dict[str, Any]] = mapped_column(JSONB)
    evidence: Mapped[dict[str, Any]] = mapped_column(JSONB)
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id"))
    recorded_at: Mapped[datetime]
