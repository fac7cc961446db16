"""The service clients table (migration 0010): the gateway's callers, kept apart from the
deployments they call so the gateway's credential check reads only what it needs
(store/deployments/service_clients.py)."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import BigInteger, Integer, LargeBinary, String
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from store.models import Base


class ServiceClient(Base):
    __tablename__ = "service_clients"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    digest: Mapped[bytes] = mapped_column(LargeBinary)
    models: Mapped[list[str]] = mapped_column(JSONB)
    roles: Mapped[list[str]] = mapped_column(JSONB)
    max_concurrent: Mapped[int | None] = mapped_column(Integer)
    rate_per_minute: Mapped[int | None] = mapped_column(Integer)
    # Prompt and completion tokens a UTC day (migration 0019; store/rollup/usage.py).
    max_tokens_per_day: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime]
    rotated_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]
