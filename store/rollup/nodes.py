"""Each node's telemetry once a minute (node_minutes), for the node panel's sparklines:
RAM, the GPUs' mean utilization, memory used and power (summed), and the highest
utilization and temperature of any of its GPUs in the minute.

The rollup worker copies the nodes' last telemetry (node_streams' last-good payload)
into the row of the minute it was received in, one INSERT ... SELECT for the fleet, so
the telemetry path itself writes nothing more. A run every few seconds sees each sample
(nodes send one every 20 s); a later run that sees the same sample writes the same row
again, and the highest utilization and temperature of the minute are kept as maxima
across the samples seen. Several workers at once leave the same rows.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from store.rollup.tables import NodeMinute

# Samples received this long ago are copied again, so a run that was late (or a worker
# down for a moment) still writes the minute before the current one.
LOOKBACK = timedelta(minutes=2)

_RECORD = text(
    """
    INSERT INTO node_minutes AS m (node_id, minute, ram_total_bytes, ram_used_bytes,
        gpu_utilization_percent, gpu_utilization_max_percent, gpu_memory_used_bytes,
        gpu_temperature_max_c, gpu_power_w)
    SELECT s.node_id, date_trunc('minute', s.good_received_at, 'UTC'),
        (s.good_payload ->> 'ram_total_bytes')::bigint,
        (s.good_payload ->> 'ram_used_bytes')::bigint,
        g.utilization, g.utilization_max, g.memory_used, g.temperature, g.power
    FROM node_streams AS s
    CROSS JOIN LATERAL (
        SELECT avg((e ->> 'utilization_percent')::float8) AS utilization,
            max((e ->> 'utilization_percent')::float8) AS utilization_max,
            sum((e ->> 'memory_used_bytes')::bigint) AS memory_used,
            max((e ->> 'temperature_c')::float8) AS temperature,
            sum((e ->> 'power_w')::float8) AS power
        FROM jsonb_array_elements(coalesce(s.good_payload -> 'gpus', '[]'::jsonb)) AS e
    ) AS g
    WHERE s.stream = 'telemetry'
        AND s.good_received_at >= statement_timestamp() - CAST(:lookback AS interval)
    ON CONFLICT (node_id, minute) DO UPDATE SET
        ram_total_bytes = excluded.ram_total_bytes,
        ram_used_bytes = excluded.ram_used_bytes,
        gpu_utilization_percent = excluded.gpu_utilization_percent,
        gpu_utilization_max_percent = greatest(
            m.gpu_utilization_max_percent, excluded.gpu_utilization_max_percent),
        gpu_memory_used_bytes = excluded.gpu_memory_used_bytes,
        gpu_temperature_max_c = greatest(m.gpu_temperature_max_c, excluded.gpu_temperature_max_c),
        gpu_power_w = excluded.gpu_power_w
    """
)


@dataclass(frozen=True)
class NodeStep:
    """One step of a node's history (null: no telemetry in it)."""

    start: datetime
    ram_total_bytes: int | None
    ram_used_bytes: int | None
    gpu_utilization_percent: float | None
    gpu_utilization_max_percent: float | None
    gpu_memory_used_bytes: int | None
    gpu_temperature_max_c: float | None
    gpu_power_w: float | None


async def record(session: AsyncSession) -> int:
    """Copy the nodes' recent telemetry into their minutes; how many rows written."""
    done = await session.execute(_RECORD, {"lookback": LOOKBACK})
    return int(done.rowcount or 0)  # type: ignore[attr-defined]


async def history(
    session: AsyncSession, node_id: uuid.UUID, since: datetime, until: datetime, step_s: int
) -> dict[datetime, NodeStep]:
    """The node's minutes in [since, until) by step start (aligned to the epoch): each
    step's means, and its maxima for the max columns (one minute a step: that minute)."""
    start = func.to_timestamp(
        func.floor(func.extract("epoch", NodeMinute.minute) / step_s) * step_s
    ).label("start")
    rows = await session.execute(
        select(
            start,
            func.avg(NodeMinute.ram_total_bytes),
            func.avg(NodeMinute.ram_used_bytes),
            func.avg(NodeMinute.gpu_utilization_percent),
            func.max(NodeMinute.gpu_utilization_max_percent),
            func.avg(NodeMinute.gpu_memory_used_bytes),
            func.max(NodeMinute.gpu_temperature_max_c),
            func.avg(NodeMinute.gpu_power_w),
        )
        .where(
            NodeMinute.node_id == node_id,
            NodeMinute.minute >= since,
            NodeMinute.minute < until,
        )
        .group_by(start)
    )
    found: dict[datetime, NodeStep] = {}
    for row in rows.all():
        found[row[0]] = NodeStep(
            start=row[0],
            ram_total_bytes=_int(row[1]),
            ram_used_bytes=_int(row[2]),
            gpu_utilization_percent=_float(row[3]),
            gpu_utilization_max_percent=_float(row[4]),
            gpu_memory_used_bytes=_int(row[5]),
            gpu_temperature_max_c=_float(row[6]),
            gpu_power_w=_float(row[7]),
        )
    return found


def _int(value: object) -> int | None:
    return None if value is None else round(float(value))  # type: ignore[arg-type]


def _float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]
