"""The fleet at a glance (issue 33): what the dashboard's Overview draws, from the
control plane's own per-minute rollup (store/rollup/, migration 0019), no Prometheus.

Routes (operator key or dashboard session):

    GET /api/v1/admin/overview                       (OVERVIEW) -> OverviewNow
        the fleet now (counted at the request) and the gateway's last complete minute
    GET /api/v1/admin/overview/history?range=1h|6h|24h  (OVERVIEW_HISTORY)
        -> OverviewHistory: one point per step (60 s; 300 s for 24h) over the range,
           ending at the start of the current minute; every step present, oldest first
    GET /api/v1/admin/hardware/nodes/{node_id}/history?range=1h|6h|24h  (NODE_HISTORY)
        -> NodeHistory: the node's telemetry, one point per step, the same steps but
           ending with the current one (its figures are samples, not sums; 404 for an
           unknown node)

Figures a point lacks are null: the fleet's when no rollup worker wrote that minute
(workers down), a node's when it sent no telemetry then. The gateway's rates are 0 in a
minute without invokes. Nodes by liveness: online, stale, offline (recorded by the
liveness sweep, enabled nodes) and disabled; decommissioned nodes are not counted. GPU
figures cover the GPUs of online and stale nodes (the ones that can serve): memory used
and utilization from their last telemetry. Services by health: ready (every desired
replica ready), degraded (some), unavailable (none), idle (scaled to 0), deleting.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Final

from schemas.base import WireModel
from schemas.protocol import ADMIN_PREFIX, NODES

OVERVIEW: Final = f"{ADMIN_PREFIX}/overview"
OVERVIEW_HISTORY: Final = f"{OVERVIEW}/history"
NODE_HISTORY: Final = f"{NODES}/{{node_id}}/history"

NODE_STATES: Final = ("online", "stale", "offline", "disabled")
SERVICE_HEALTH: Final = ("ready", "degraded", "unavailable", "idle", "deleting")


class HistoryRange(StrEnum):
    HOUR = "1h"
    SIX_HOURS = "6h"
    DAY = "24h"


RANGE_SPAN: Final = {
    HistoryRange.HOUR: timedelta(hours=1),
    HistoryRange.SIX_HOURS: timedelta(hours=6),
    HistoryRange.DAY: timedelta(hours=24),
}
# A day at one point a minute is 1,440 points per series: five minutes draw the same.
RANGE_STEP: Final = {
    HistoryRange.HOUR: timedelta(minutes=1),
    HistoryRange.SIX_HOURS: timedelta(minutes=1),
    HistoryRange.DAY: timedelta(minutes=5),
}


class GpuFigures(WireModel):
    count: int
    memory_total_bytes: int
    memory_used_bytes: int
    memory_free_bytes: int
    # Mean over the GPUs that reported it; null when none did.
    utilization_percent: float | None


class GatewayFigures(WireModel):
    """The gateway's invokes of one window, every client and model summed."""

    window_start: datetime
    window_s: float
    requests_per_s: float
    errors_per_s: float
    # Error code -> invokes per second.
    errors: dict[str, float]
    prompt_tokens_per_s: float
    completion_tokens_per_s: float
    # Prompt and completion.
    tokens_per_s: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None


class OverviewNow(WireModel):
    at: datetime
    # NODE_STATES -> count (every state present).
    nodes: dict[str, int]
    gpus: GpuFigures
    # Deployment state -> count, every state but the ended ones (unloaded, failed).
    deployments: dict[str, int]
    # SERVICE_HEALTH -> count (every state present).
    services: dict[str, int]
    # The last complete minute.
    gateway: GatewayFigures


class OverviewPoint(WireModel):
    start: datetime
    # The fleet as the rollup worker last saw it in the step (null: no row).
    nodes: dict[str, int] | None
    gpus: GpuFigures | None
    deployments: dict[str, int] | None
    services: dict[str, int] | None
    # Averaged over the step.
    requests_per_s: float
    errors_per_s: float
    prompt_tokens_per_s: float
    completion_tokens_per_s: float
    tokens_per_s: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None


class OverviewHistory(WireModel):
    range: HistoryRange
    step_s: int
    since: datetime
    until: datetime
    points: list[OverviewPoint]


class NodePoint(WireModel):
    start: datetime
    # Null: the node sent no telemetry in the step (or no GPU reported the figure).
    ram_total_bytes: int | None = None
    ram_used_bytes: int | None = None
    # Mean over the node's GPUs (and the step); the highest sampled.
    gpu_utilization_percent: float | None = None
    gpu_utilization_max_percent: float | None = None
    # Summed over its GPUs.
    gpu_memory_used_bytes: int | None = None
    gpu_temperature_max_c: float | None = None
    gpu_power_w: float | None = None


class NodeHistory(WireModel):
    node_id: uuid.UUID
    range: HistoryRange
    step_s: int
    since: datetime
    until: datetime
    points: list[NodePoint]
