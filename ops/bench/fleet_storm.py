"""The fleet bench's return storm (ops/bench/fleet.py --return-storm): every API process
stopped for 2x the offline threshold and started again under the fleet's cadence."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import asyncpg

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import wrk_fleet  # noqa: E402
from fleet_stack import HEARTBEAT_S, OFFLINE_S, ApiChild, false_transitions  # noqa: E402

# The return storm: how long the returning fleet may take to be all online.
STORM_MAX_S = 300.0


@dataclass(frozen=True)
class Storm:
    outage_s: float
    # From the API answering again until every node is recorded online and heard since.
    all_online_s: float | None
    p50_ms: float
    p99_ms: float
    errors: int
    false_transitions: int

    def line(self) -> str:
        online = "never" if self.all_online_s is None else f"{self.all_online_s:.1f} s"
        return (
            f"  return storm (API down {self.outage_s:.0f} s): every node online after"
            f" {online}; heartbeat p50 {self.p50_ms:.1f} ms, p99 {self.p99_ms:.1f} ms;"
            f" {self.errors} errors; false stale/offline transitions {self.false_transitions}"
        )


async def _heard_since(dsn: str, since: float) -> int:
    connection = await asyncpg.connect(dsn)
    try:
        count: int = await connection.fetchval(
            "SELECT count(*) FROM nodes WHERE liveness = 'online'"
            " AND last_heartbeat_at > to_timestamp($1)",
            since,
        )
    finally:
        await connection.close()
    return count


def return_storm(
    nodes: int,
    api: ApiChild,
    api_url: str,
    dsn: str,
    fleet_for: Callable[[float], list[subprocess.Popen[str]]],
) -> Storm:
    """Every API process stopped for 2x the offline threshold, then started again, the
    fleet heartbeating at its cadence from the moment it answers (wrk paces the
    returning nodes as their agents would, each at its own point of the period)."""
    outage_s = 2 * OFFLINE_S
    began = time.time()
    api.stop()
    time.sleep(outage_s)
    api.start(api_url)
    back = time.time()
    procs = fleet_for(STORM_MAX_S)
    all_online_s = None
    while time.time() - back < STORM_MAX_S - 5:
        if asyncio.run(_heard_since(dsn, back)) >= nodes:
            all_online_s = time.time() - back
            break
        time.sleep(1)
    # A few more periods, so the storm's latency is not only its first seconds.
    time.sleep(HEARTBEAT_S)
    for proc in procs:
        proc.send_signal(signal.SIGINT)
    beat, telemetry = (wrk_fleet.result(proc, 60) for proc in procs)
    return Storm(
        outage_s=outage_s,
        all_online_s=all_online_s,
        p50_ms=beat.p50_s * 1e3,
        p99_ms=beat.p99_s * 1e3,
        errors=beat.errors + telemetry.errors,
        false_transitions=asyncio.run(false_transitions(dsn, began)),
    )
