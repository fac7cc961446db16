"""How the fleet bench (ops/bench/fleet.py) drives a fleet: `modelforge simulate`
processes (the agent's own code), or paced wrk (ops/bench/wrk_fleet.py) after enrolling
the nodes and sending their inventory, with a warm-up until the fleet settled."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import heartbeats as hb  # noqa: E402  (sibling bench module: processes, database)
import loop_figures  # noqa: E402
import wrk_fleet  # noqa: E402
from fleet_stack import HEARTBEAT_S, Window, metric  # noqa: E402

from schemas.protocol import HEARTBEAT, INVENTORY, TELEMETRY  # noqa: E402

WARMUP_MAX_S = 300.0


@dataclass
class Driven:
    enrolled: int
    enroll_s: float
    p50_ms: float | None
    p99_ms: float | None
    heartbeats: int
    errors: int
    # wrk: seconds of warm-up until the fleet settled (no transactional heartbeats).
    settle_s: float | None = None
    # wrk: telemetry's latency at the client (it waits for its group commit).
    telemetry_ms: tuple[float, float] | None = None
    # wrk: the errors by phase and kind.
    error_kinds: str = ""
    # wrk: the API's full collections in the steady window (ops/bench/loop_figures.py).
    steady_gc: str = ""
    # wrk: starts the fleet's heartbeats and telemetry for a given time (the storm).
    fleet_for: Callable[[float], list[subprocess.Popen[str]]] | None = None


def drive_simulate(
    nodes: int, args: argparse.Namespace, api_url: str, admin_key: str, workdir: Path,
    env: dict[str, str], window: Window,
) -> Driven:  # fmt: skip
    processes = max(1, math.ceil(nodes / args.per_process))
    sims: list[tuple[subprocess.Popen[str], Path]] = []
    for i in range(processes):
        share = nodes // processes + (1 if i < nodes % processes else 0)
        report = workdir / f"sim-{i}.json"
        argv = [
            sys.executable, "-m", "cli.main", "simulate",
            "--nodes", str(share), "--api-url", api_url, "--operator-key", admin_key,
            "--duration", str(args.duration),
            "--heartbeat-interval", str(HEARTBEAT_S),
            "--telemetry-interval", str(args.telemetry_interval),
            "--inventory-interval", "60",
            "--concurrency", str(args.concurrency),
            "--report-json", str(report),
            "--latency-warmup", str(args.warmup),
        ]  # fmt: skip
        proc = subprocess.Popen(
            argv, cwd=hb.ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        sims.append((proc, report))
    # The steady state begins once every simulator has enrolled its nodes.
    for proc, _ in sims:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("publishing:"):
                break
    generators = [proc.pid for proc, _ in sims]
    window.open(generators)
    time.sleep(max(0.0, args.duration - 2))
    window.close(generators)
    for proc, _ in sims:
        proc.wait(timeout=args.duration + 120)
    reports = [json.loads(report.read_text()) for _, report in sims]

    # Percentiles across simulators: the worst one's, a conservative merge.
    def worst(q: str) -> float | None:
        values = [r["latency_s"].get("heartbeat", {}).get(q) for r in reports]
        known = [v for v in values if v is not None]
        return max(known) * 1e3 if known else None

    return Driven(
        enrolled=sum(r["enrolled"] for r in reports),
        enroll_s=max(r["enroll_s"] for r in reports),
        p50_ms=worst("p50"),
        p99_ms=worst("p99"),
        heartbeats=sum(r["sent"].get("heartbeat", 0) for r in reports),
        errors=sum(sum(r["failures"].values()) for r in reports),
    )


def _inventory(node: hb.Node, gpus: list[str]) -> dict[str, object]:
    return {
        "node_id": node.node_id, "sequence": 1, "observed_at": utc_now(), "complete": True,
        "host": {"hostname": f"bench-{node.node_id[:8]}", "cpu_count": 32,
                 "ram_total_bytes": 2**38, "storage_total_bytes": 2**41},
        "gpus": [
            {"uuid": u, "index": i, "name": "Simulated H100", "pci_bus_id": f"0000:{i:02x}:00.0",
             "memory_total_bytes": 80 * 2**30}
            for i, u in enumerate(gpus)
        ],
    }  # fmt: skip


def _telemetry(node: hb.Node, gpus: list[str]) -> dict[str, object]:
    return {
        "node_id": node.node_id, "sequence": 0, "observed_at": "", "ram_total_bytes": 2**38,
        "ram_used_bytes": 2**36,
        "storage": [{"path": "/", "total_bytes": 2**41, "used_bytes": 2**39}],
        "gpus": [
            {"uuid": u, "utilization_percent": 40.0, "memory_used_bytes": 2**34,
             "temperature_c": 55.0, "power_w": 350.0}
            for u in gpus
        ],
    }  # fmt: skip


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


async def _enroll_with_inventory(
    api_url: str, admin_key: str, nodes: int
) -> tuple[list[hb.Node], dict[str, list[str]]]:
    fleet = await hb.enroll_nodes(api_url, admin_key, nodes, concurrency=32)
    gpus = {node.node_id: [f"GPU-{node.node_id}-{i}" for i in range(2)] for node in fleet}
    gate = asyncio.Semaphore(32)

    async def send(client: httpx.AsyncClient, node: hb.Node) -> None:
        async with gate:
            while True:
                response = await client.put(
                    INVENTORY,
                    json=_inventory(node, gpus[node.node_id]),
                    headers={"Authorization": f"Bearer {node.credential}"},
                )
                if response.status_code != 429:  # shed (api/shedding.py): as an agent does
                    break
                await asyncio.sleep(float(response.headers.get("Retry-After", "1")))
            response.raise_for_status()

    async with hb.async_client(api_url, 32) as client:
        await asyncio.gather(*(send(client, node) for node in fleet))
    return fleet, gpus


def _transactional_heartbeats(api_url: str) -> float:
    metrics = httpx.get(f"{api_url}/metrics", timeout=10).text
    return metric(metrics, "modelforge_heartbeats_total", path="transactional")


def settle(api_url: str, at_least_s: float) -> float:
    """Seconds until no heartbeat took the transactional path for 10 s (at least
    `at_least_s`, at most WARMUP_MAX_S)."""
    started = time.monotonic()
    last, quiet_since = _transactional_heartbeats(api_url), time.monotonic()
    while (elapsed := time.monotonic() - started) < WARMUP_MAX_S - 10:
        time.sleep(2)
        now = _transactional_heartbeats(api_url)
        if now != last:
            last, quiet_since = now, time.monotonic()
        elif elapsed >= at_least_s and time.monotonic() - quiet_since >= 10:
            return elapsed
    print(f"  (did not settle within {WARMUP_MAX_S:.0f} s)", flush=True)
    return time.monotonic() - started


def drive_wrk(
    nodes: int, args: argparse.Namespace, api_url: str, admin_key: str, workdir: Path,
    window: Window,
) -> Driven:  # fmt: skip
    started = time.monotonic()
    fleet, gpus = asyncio.run(_enroll_with_inventory(api_url, admin_key, nodes))
    enroll_s = time.monotonic() - started
    beats = wrk_fleet.requests_file(
        workdir / "heartbeats.requests",
        [(n.credential, wrk_fleet.template(hb.heartbeat(n))) for n in fleet],
    )
    samples = wrk_fleet.requests_file(
        workdir / "telemetry.requests",
        [
            (
                n.credential,
                wrk_fleet.template(
                    _telemetry(n, gpus[n.node_id]), sequence="sequence", observed_at="observed_at"
                ),
            )
            for n in fleet
        ],
    )
    connections = max(16, min(512, nodes // 20))

    def both(duration_s: float) -> list[subprocess.Popen[str]]:
        return [
            wrk_fleet.start(
                api_url, HEARTBEAT, "POST", beats, interval_s=HEARTBEAT_S,
                duration_s=duration_s, connections=connections, workdir=workdir,
            ),
            wrk_fleet.start(
                api_url, TELEMETRY, "PUT", samples, interval_s=args.telemetry_interval,
                duration_s=duration_s, connections=max(8, connections // 2), workdir=workdir,
            ),
        ]  # fmt: skip

    # Warm-up: the fleet was silent while it enrolled (minutes at the larger sizes, so
    # stale or offline), and every node's first heartbeats are transactional. Measuring
    # starts once that herd has settled: for 10 s, no transactional heartbeats at all.
    warm = both(WARMUP_MAX_S)
    settled_s = settle(api_url, args.warmup)
    for proc in warm:
        proc.send_signal(signal.SIGINT)  # wrk stops and prints its summary
    warm_results = [wrk_fleet.result(proc, 60) for proc in warm]
    measured = both(args.duration)
    before = httpx.get(f"{api_url}/metrics", timeout=10).text
    window.open([proc.pid for proc in measured])
    time.sleep(max(0.0, args.duration - 2))
    window.close([proc.pid for proc in measured])
    after = httpx.get(f"{api_url}/metrics", timeout=10).text
    steady_gc = loop_figures.steady_gc_line(before, after)
    beat, telemetry = (wrk_fleet.result(proc, args.duration + 60) for proc in measured)
    return Driven(
        enrolled=len(fleet),
        enroll_s=enroll_s,
        p50_ms=beat.p50_s * 1e3,
        p99_ms=beat.p99_s * 1e3,
        heartbeats=beat.requests,
        errors=beat.errors + telemetry.errors + sum(r.errors for r in warm_results),
        settle_s=settled_s,
        telemetry_ms=(telemetry.p50_s * 1e3, telemetry.p99_s * 1e3),
        fleet_for=both,
        steady_gc=steady_gc,
        error_kinds="; ".join(
            f"{phase} {result.described()}"
            for phase, result in [
                ("warm-up heartbeats", warm_results[0]),
                ("warm-up telemetry", warm_results[1]),
                ("heartbeats", beat),
                ("telemetry", telemetry),
            ]
            if result.errors
        ),
    )
