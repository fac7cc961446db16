"""The fleet at a glance (schemas/overview.py): the counts now, their history, and a
node's telemetry history, from the rollup (store/rollup/). Included in the admin router
(operator check)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from fastapi import APIRouter
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from api.deps import AdminTransaction, State
from api.errors import error_responses
from schemas.errors import ErrorCode
from schemas.overview import (
    NODE_HISTORY,
    OVERVIEW,
    OVERVIEW_HISTORY,
    RANGE_SPAN,
    RANGE_STEP,
    GatewayFigures,
    GpuFigures,
    HistoryRange,
    NodeHistory,
    NodePoint,
    OverviewHistory,
    OverviewNow,
    OverviewPoint,
)
from store.errors import Missing
from store.models import Node
from store.rollup import fleet, nodes, usage_report
from store.rollup.fleet import FleetCounts
from store.rollup.usage_report import Summed

router = APIRouter()
MISSING = error_responses(404)
MINUTE = timedelta(minutes=1)
# What a flush may take beyond its interval (api/gateway/usage.py: one statement).
FLUSH_GRACE = timedelta(seconds=2)


async def _now(session: AsyncSession) -> datetime:
    at: datetime = (await session.execute(select(func.statement_timestamp()))).scalar_one()
    return at.astimezone(UTC)


def _gpus(counts: FleetCounts) -> GpuFigures:
    return GpuFigures(
        count=counts.gpus,
        memory_total_bytes=counts.gpu_memory_total_bytes,
        memory_used_bytes=counts.gpu_memory_used_bytes,
        memory_free_bytes=max(0, counts.gpu_memory_total_bytes - counts.gpu_memory_used_bytes),
        utilization_percent=counts.gpu_utilization_percent,
    )


def _gateway(start: datetime, window: timedelta, summed: Summed) -> GatewayFigures:
    seconds = window.total_seconds()
    tokens = summed.prompt_tokens + summed.completion_tokens
    return GatewayFigures(
        window_start=start,
        window_s=seconds,
        requests_per_s=summed.requests / seconds,
        errors_per_s=summed.error_count / seconds,
        errors={code: count / seconds for code, count in sorted(summed.errors.items())},
        prompt_tokens_per_s=summed.prompt_tokens / seconds,
        completion_tokens_per_s=summed.completion_tokens / seconds,
        tokens_per_s=tokens / seconds,
        ttft_p50_s=summed.p50(),
        ttft_p99_s=summed.p99(),
    )


def _floor(at: datetime, step: timedelta) -> datetime:
    seconds = int(step.total_seconds())
    return datetime.fromtimestamp(int(at.timestamp()) // seconds * seconds, UTC)


def _steps(now: datetime, span: HistoryRange) -> tuple[datetime, datetime, timedelta]:
    """[since, until) of a history: whole steps, ending where the current step begins."""
    step = RANGE_STEP[span]
    until = _floor(now, step)
    return until - RANGE_SPAN[span], until, step


def last_minute(at: datetime, flush_interval_s: float) -> datetime:
    """The start of the last minute every API process has flushed by `at`: each adds
    its counts every `flush_interval_s`, so the minute just ended is short of its last
    seconds' invokes until then (a live rate read early in a minute fell by up to a
    flush interval's share of it)."""
    settled = at - timedelta(seconds=flush_interval_s) - FLUSH_GRACE
    return _floor(settled, MINUTE) - MINUTE


@router.get(OVERVIEW)
async def overview(session: AdminTransaction, state: State) -> OverviewNow:
    """Nodes, GPUs, deployments and services now; the gateway's last complete minute
    (complete once every API process has flushed it)."""
    at = await _now(session)
    counts = await fleet.counts(session)
    start = last_minute(at, state.settings.gateway_measure_interval_s)
    window = await usage_report.gateway_window(session, start, start + MINUTE)
    return OverviewNow(
        at=at,
        nodes=counts.nodes,
        gpus=_gpus(counts),
        deployments=counts.deployments,
        services=counts.services,
        gateway=_gateway(start, MINUTE, window),
    )


@router.get(OVERVIEW_HISTORY)
async def overview_history(
    session: AdminTransaction, range: HistoryRange = HistoryRange.HOUR
) -> OverviewHistory:
    """The overview's figures per step over the range (60 s steps; 300 s for 24h)."""
    since, until, step = _steps(await _now(session), range)
    step_s = int(step.total_seconds())
    counts = await fleet.history(session, since, until, step_s)
    gateway = await usage_report.gateway_series(session, since, until, step_s)
    points = []
    start = since
    while start < until:
        found = counts.get(start)
        figures = _gateway(start, step, gateway.get(start) or Summed())
        points.append(
            OverviewPoint(
                start=start,
                nodes=None if found is None else found.nodes,
                gpus=None if found is None else _gpus(found),
                deployments=None if found is None else found.deployments,
                services=None if found is None else found.services,
                requests_per_s=figures.requests_per_s,
                errors_per_s=figures.errors_per_s,
                prompt_tokens_per_s=figures.prompt_tokens_per_s,
                completion_tokens_per_s=figures.completion_tokens_per_s,
                tokens_per_s=figures.tokens_per_s,
                ttft_p50_s=figures.ttft_p50_s,
                ttft_p99_s=figures.ttft_p99_s,
            )
        )
        start += step
    return OverviewHistory(range=range, step_s=step_s, since=since, until=until, points=points)


@router.get(NODE_HISTORY, responses=MISSING)
async def node_history(
    node_id: uuid.UUID, session: AdminTransaction, range: HistoryRange = HistoryRange.HOUR
) -> NodeHistory:
    """The node's telemetry per step over the range, for the node panel's sparklines."""
    if await session.get(Node, node_id) is None:
        raise Missing(f"node {node_id} does not exist", code=ErrorCode.NOT_FOUND)
    since, until, step = _steps(await _now(session), range)
    # The current step too: a node's figures are samples, not sums, so a step under way
    # is already what the panel draws.
    since, until = since + step, until + step
    step_s = int(step.total_seconds())
    found = await nodes.history(session, node_id, since, until, step_s)
    points = []
    start = since
    while start < until:
        row = found.get(start)
        points.append(NodePoint(start=start, **({} if row is None else _node_figures(row))))
        start += step
    return NodeHistory(
        node_id=node_id, range=range, step_s=step_s, since=since, until=until, points=points
    )


def _node_figures(row: nodes.NodeStep) -> dict[str, int | float | None]:
    return {
        "ram_total_bytes": row.ram_total_bytes,
        "ram_used_bytes": row.ram_used_bytes,
        "gpu_utilization_percent": row.gpu_utilization_percent,
        "gpu_utilization_max_percent": row.gpu_utilization_max_percent,
        "gpu_memory_used_bytes": row.gpu_memory_used_bytes,
        "gpu_temperature_max_c": row.gpu_temperature_max_c,
        "gpu_power_w": row.gpu_power_w,
    }
