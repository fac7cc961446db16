"""The fleet's counts: counted now for the overview (one grouped query per figure, so
the cost stays a few scans of indexed tables at 10,000 nodes), and written once a minute
by the rollup worker (`record`) for the history.

`record` writes the counts of the minute it runs in, overwriting what an earlier run in
the same minute wrote: the counts are absolute, so any number of workers writing at once
leave one row per minute, the last counts of that minute.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, case, func, literal_column, select, text
from sqlalchemy.dialects.postgresql import distinct_on, insert
from sqlalchemy.ext.asyncio import AsyncSession

from schemas.deployments import ENDED_STATES, DeploymentState
from schemas.overview import NODE_STATES, SERVICE_HEALTH
from schemas.services import ReplicaPhase, ServiceState
from store.deployments.tables import Deployment
from store.models import Gpu, Node
from store.rollup.tables import FleetMinute
from store.services.tables import Service, ServiceReplica

# The nodes whose GPUs count: they can serve (enabled, heard from lately).
_SERVING = ("online", "stale")
_ENDED = tuple(state.value for state in ENDED_STATES)
_LIVE = tuple(state.value for state in DeploymentState if state not in ENDED_STATES)


@dataclass(frozen=True)
class FleetCounts:
    nodes: dict[str, int]
    gpus: int
    gpu_memory_total_bytes: int
    gpu_memory_used_bytes: int
    gpu_utilization_percent: float | None
    deployments: dict[str, int]
    services: dict[str, int]

    def row(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes,
            "gpus": self.gpus,
            "gpu_memory_total_bytes": self.gpu_memory_total_bytes,
            "gpu_memory_used_bytes": self.gpu_memory_used_bytes,
            "gpu_utilization_percent": self.gpu_utilization_percent,
            "deployments": self.deployments,
            "services": self.services,
        }


def _serving_node() -> Any:
    return and_(
        Node.enabled.is_(True),
        Node.decommissioned_at.is_(None),
        Node.liveness.in_(_SERVING),
    )


async def _nodes(session: AsyncSession) -> dict[str, int]:
    state = case((Node.enabled.is_(False), literal_column("'disabled'")), else_=Node.liveness)
    rows = await session.execute(
        select(state, func.count()).where(Node.decommissioned_at.is_(None)).group_by(state)
    )
    counts = dict.fromkeys(NODE_STATES, 0)
    for name, count in rows.all():
        counts[str(name)] = int(count)
    return counts


async def _gpus(session: AsyncSession) -> tuple[int, int]:
    row = (
        await session.execute(
            select(func.count(), func.coalesce(func.sum(Gpu.memory_total_bytes), 0))
            .join(Node, Node.id == Gpu.node_id)
            .where(Gpu.missing_since.is_(None), _serving_node())
        )
    ).one()
    return int(row[0]), int(row[1])


# Memory used and mean utilization over the GPUs in the serving nodes' last telemetry.
_GPU_USE = text(
    """
    SELECT coalesce(sum((g ->> 'memory_used_bytes')::bigint), 0) AS used,
        avg((g ->> 'utilization_percent')::float8) AS utilization
    FROM node_streams AS s
    JOIN nodes AS n ON n.id = s.node_id
    CROSS JOIN LATERAL jsonb_array_elements(coalesce(s.good_payload -> 'gpus', '[]'::jsonb)) AS g
    WHERE s.stream = 'telemetry' AND n.enabled AND n.decommissioned_at IS NULL
        AND n.liveness IN ('online', 'stale')
    """
)


async def _gpu_use(session: AsyncSession) -> tuple[int, float | None]:
    row = (await session.execute(_GPU_USE)).one()
    return int(row.used), None if row.utilization is None else float(row.utilization)


async def _deployments(session: AsyncSession) -> dict[str, int]:
    rows = await session.execute(
        select(Deployment.state, func.count())
        .where(Deployment.state.not_in(_ENDED))
        .group_by(Deployment.state)
    )
    counts = dict.fromkeys(_LIVE, 0)
    for state, count in rows.all():
        counts[str(state)] = int(count)
    return counts


async def _services(session: AsyncSession) -> dict[str, int]:
    ready = (
        select(func.count())
        .where(
            ServiceReplica.service_id == Service.id,
            ServiceReplica.phase == ReplicaPhase.READY.value,
        )
        .correlate(Service)
        .scalar_subquery()
    )
    health = case(
        (Service.state == ServiceState.DELETING.value, literal_column("'deleting'")),
        (Service.replicas == 0, literal_column("'idle'")),
        (ready >= Service.replicas, literal_column("'ready'")),
        (ready > 0, literal_column("'degraded'")),
        else_=literal_column("'unavailable'"),
    )
    rows = await session.execute(
        select(health, func.count())
        .where(Service.state != ServiceState.DELETED.value)
        .group_by(health)
    )
    counts = dict.fromkeys(SERVICE_HEALTH, 0)
    for name, count in rows.all():
        counts[str(name)] = int(count)
    return counts


async def counts(session: AsyncSession) -> FleetCounts:
    """The fleet now (call it in one transaction for one snapshot)."""
    gpus, total = await _gpus(session)
    used, utilization = await _gpu_use(session)
    return FleetCounts(
        nodes=await _nodes(session),
        gpus=gpus,
        gpu_memory_total_bytes=total,
        gpu_memory_used_bytes=used,
        gpu_utilization_percent=utilization,
        deployments=await _deployments(session),
        services=await _services(session),
    )


async def record(session: AsyncSession) -> datetime:
    """Write the fleet's counts as the row of the current minute (database clock); the
    minute written."""
    found = await counts(session)
    minute = func.date_trunc("minute", func.statement_timestamp(), "UTC")
    statement = insert(FleetMinute).values(minute=minute, **found.row())
    written = await session.execute(
        statement.on_conflict_do_update(
            index_elements=[FleetMinute.minute],
            set_={column: statement.excluded[column] for column in found.row()},
        ).returning(FleetMinute.minute)
    )
    at: datetime = written.scalar_one()
    return at


async def history(
    session: AsyncSession, since: datetime, until: datetime, step_s: int
) -> dict[datetime, FleetCounts]:
    """The last fleet row of each step in [since, until), keyed by the step's start
    (aligned to the epoch, so to UTC minutes)."""
    start = func.to_timestamp(
        func.floor(func.extract("epoch", FleetMinute.minute) / step_s) * step_s
    ).label("start")
    rows = await session.execute(
        select(start, FleetMinute)
        .where(FleetMinute.minute >= since, FleetMinute.minute < until)
        .order_by(start, FleetMinute.minute.desc())
        .ext(distinct_on(start))
    )
    found: dict[datetime, FleetCounts] = {}
    for step_start, row in rows.all():
        found[step_start] = FleetCounts(
            nodes=dict(row.nodes),
            gpus=row.gpus,
            gpu_memory_total_bytes=row.gpu_memory_total_bytes,
            gpu_memory_used_bytes=row.gpu_memory_used_bytes,
            gpu_utilization_percent=row.gpu_utilization_percent,
            deployments=dict(row.deployments),
            services=dict(row.services),
        )
    return found
