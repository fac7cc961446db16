"""The rollup's tables (migration 0019)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Float, Index, Integer, String
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import Mapped, mapped_column

from store.models import Base


class UsageMinute(Base):
    """The gateway's invokes of one minute, service client, served model and outcome
    ("ok" or the error code the client got). Additive: every API process adds its own
    counts (store/rollup/usage.py: add)."""

    __tablename__ = "usage_minutes"

    minute: Mapped[datetime] = mapped_column(primary_key=True)
    client_id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    outcome: Mapped[str] = mapped_column(String(64), primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    completion_tokens: Mapped[int] = mapped_column(BigInteger)
    ttft_count: Mapped[int] = mapped_column(BigInteger)
    ttft_sum_s: Mapped[float] = mapped_column(Float)
    # Counts per bucket of schemas/usage.py: TTFT_BUCKETS_S; buckets add up, so any
    # range's percentiles come from the summed counts.
    ttft_buckets: Mapped[list[int]] = mapped_column(ARRAY(BigInteger))

    __table_args__ = (Index("ix_usage_minutes_client_minute", "client_id", "minute"),)


class FleetMinute(Base):
    """The fleet's counts as the rollup worker saw them in one minute."""

    __tablename__ = "fleet_minutes"

    minute: Mapped[datetime] = mapped_column(primary_key=True)
    # Count per liveness (online, stale, offline), per state.
    nodes: Mapped[dict[str, Any]] = mapped_column(JSONB)
    gpus: Mapped[int] = mapped_column(Integer)
    gpu_memory_total_bytes: Mapped[int] = mapped_column(BigInteger)
    gpu_memory_used_bytes: Mapped[int] = mapped_column(BigInteger)
    gpu_utilization_percent: Mapped[float | None] = mapped_column(Float)
    deployments: Mapped[dict[str, Any]] = mapped_column(JSONB)
    services: Mapped[dict[str, Any]] = mapped_column(JSONB)


class NodeMinute(Base):
    """One node's telemetry in one minute (the node panel's sparklines): its last sample
    of the minute, the GPUs' figures summed (memory, power) or averaged (utilization),
    and the highest utilization and temperature sampled in the minute."""

    __tablename__ = "node_minutes"

    node_id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    minute: Mapped[datetime] = mapped_column(primary_key=True)
    ram_total_bytes: Mapped[int | None] = mapped_column(BigInteger)
    ram_used_bytes: Mapped[int | None] = mapped_column(BigInteger)
    gpu_utilization_percent: Mapped[float | None] = mapped_column(Float)
    gpu_utilization_max_percent: Mapped[float | None] = mapped_column(Float)
    gpu_memory_used_bytes: Mapped[int | None] = mapped_column(BigInteger)
    gpu_temperature_max_c: Mapped[float | None] = mapped_column(Float)
    gpu_power_w: Mapped[float | None] = mapped_column(Float)

    __table_args__ = (Index("ix_node_minutes_minute", "minute"),)
