"""A fleet on one box: N simulated nodes at the real cadence against one API process and
one worker on embedded PostgreSQL and NATS, per fleet size.

    python ops/bench/fleet.py [--sizes 1000,2500,5000,10000] [--duration 300]

For each size a fresh stack (database, nats-server, `modelforge api`, `modelforge
worker`) and `modelforge simulate` processes (at most --per-process nodes each): 10 s
heartbeats, telemetry every --telemetry-interval (20 s), inventory checked every 60 s and
sent on change. After every node is enrolled the steady state runs for --duration; then,
per size:

* heartbeat p50/p99 at the client (simulator: first attempt to success), after --warmup
  (30 s: every node's first, transactional round is a burst, not the steady state), and
  errors;
* false liveness transitions: node.liveness.changed to stale or offline during the
  steady state (every node kept heartbeating, so each one is false; must be 0);
* CPU seconds per 1,000 nodes per minute of the API, the worker and PostgreSQL (from
  /proc over the steady state), and the API's RSS at the end;
* the API's own view (its /metrics): heartbeats by path, and the server-side latency.

`--return-storm` (wrk driver): then every API process is stopped for 2x the offline
threshold and started again, the fleet heartbeating at its cadence from the moment it
answers: seconds until every node is online and heard again, heartbeat p50/p99 over the
storm, errors, and false stale/offline transitions since the stop (must be 0).

The simulators share the machine's CPUs with everything they measure: at the larger
sizes they are part of what saturates it, which the CPU figures show.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import heartbeats as hb  # noqa: E402  (sibling bench module: processes, database)
import loop_figures  # noqa: E402
import wrk_fleet  # noqa: E402

from schemas.protocol import HEARTBEAT, INVENTORY, TELEMETRY  # noqa: E402

HEARTBEAT_S = 10.0
STALE_S = 30.0
OFFLINE_S = 90.0
WARMUP_MAX_S = 300.0
# The return storm: how long the returning fleet may take to be all online.
STORM_MAX_S = 300.0
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> float:
    """CPU of the processes and of their children that have exited (cutime, cstime):
    PostgreSQL's backends come and go, and counting only the live ones made the
    figure fall, even below zero, when a busy backend ended during the window."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(field) for field in fields[11:15])
    return total / TICKS


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def tree(pid: int) -> list[int]:
    """pid and its descendants (the worker's children, PostgreSQL's backends)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found, stack = [], [pid]
    while stack:
        current = stack.pop()
        found.append(current)
        stack.extend(children.get(current, []))
    return found


@dataclass
class SizeResult:
    nodes: int
    enrolled: int
    enroll_s: float
    steady_s: float
    p50_ms: float | None
    p99_ms: float | None
    heartbeats: int
    errors: int
    false_transitions: int
    cpu: dict[str, float]
    api_rss_mib: float
    routine_share: float
    settle_s: float | None = None
    error_kinds: str = ""
    storm: Storm | None = None
    telemetry_ms: tuple[float, float] | None = None
    loop: str = ""

    def lines(self) -> list[str]:
        per = 1000 / self.nodes * 60 / self.steady_s if self.steady_s else 0.0
        cpu = ", ".join(f"{name} {seconds * per:.2f}" for name, seconds in self.cpu.items())

        def ms(value: float | None) -> str:
            return "n/a" if value is None else f"{value:.1f} ms"

        settled = "" if self.settle_s is None else f", settled after {self.settle_s:.0f} s"
        return [
            f"{self.nodes} nodes ({self.enrolled} enrolled in {self.enroll_s:.0f} s{settled}),"
            f" steady {self.steady_s:.0f} s:",
            f"  heartbeat at the client after the warm-up: p50 {ms(self.p50_ms)},"
            f" p99 {ms(self.p99_ms)};"
            f" {self.heartbeats} sent, {self.errors} errors;"
            f" {self.routine_share:.0%} routine at the API",
            *(
                [f"  telemetry at the client: p50 {ms(t[0])}, p99 {ms(t[1])}"]
                if (t := self.telemetry_ms)
                else []
            ),
            *([f"  errors: {self.error_kinds}"] if self.error_kinds else []),
            f"  false stale/offline transitions: {self.false_transitions}",
            f"  CPU s per 1,000 nodes per minute: {cpu}; API RSS {self.api_rss_mib:.0f} MiB",
            *([f"  API: {self.loop}"] if self.loop else []),
            *([self.storm.line()] if self.storm else []),
        ]


def _metric(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.split("{")[0].split(" ")[0] != name:
            continue
        if dict(re.findall(r'(\w+)="([^"]*)"', line.split(" ")[0])) == labels:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


class ApiChild:
    """The stack's `modelforge api`, which the return storm stops and starts again."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.argv, self.env, self.log = argv, env, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, url: str) -> int:
        from agent.processes import start_process

        self.proc = start_process(self.argv, env=self.env, log_path=self.log, cwd=hb.ROOT)
        hb.wait_healthy("the API", url, self.proc, self.log)
        return self.proc.pid

    def stop(self) -> None:
        from agent.processes import stop_process

        if self.proc is not None:
            stop_process(self.proc, sig=signal.SIGTERM, timeout_s=45.0)


@contextlib.contextmanager
def stack(
    workdir: Path, env: dict[str, str], api_processes: int
) -> Iterator[tuple[str, str, str, dict[str, int], ApiChild]]:
    """(API URL, operator key, libpq DSN, pids by role, the API) of a fresh stack."""
    from stack.embedded_nats import EmbeddedNats

    admin_key = secrets.token_urlsafe(24)
    with hb.database(workdir, True) as (database_url, _), EmbeddedNats(workdir / "nats") as js:
        common = env | {
            "MODELFORGE_DATABASE_URL": database_url,
            "MODELFORGE_NATS_URL": js.url,
            "MODELFORGE_HEARTBEAT_INTERVAL_S": str(HEARTBEAT_S),
            "MODELFORGE_STALE_AFTER_S": str(STALE_S),
            "MODELFORGE_OFFLINE_AFTER_S": str(OFFLINE_S),
            "MODELFORGE_LOG_LEVEL": "WARNING",
            "MODELFORGE_METRICS_PORT": "0",
        }
        port = hb.free_port()
        api_env = common | {
            "MODELFORGE_OPERATOR_API_KEY": admin_key,
            "MODELFORGE_PORT": str(port),
            "MODELFORGE_DB_POOL_SIZE": "20",
        }
        api_url = f"http://127.0.0.1:{port}"
        dsn = database_url.replace("postgresql+asyncpg://", "postgresql://")
        worker_argv = [sys.executable, "-m", "cli.main", "worker", "--threads", "4"]
        api_argv = [sys.executable, "-m", "cli.main", "api", "--processes", str(api_processes)]
        api = ApiChild(api_argv, api_env, workdir / "api.log")
        with hb.child(worker_argv, common, workdir / "worker.log") as worker:
            try:
                api_pid = api.start(api_url)
                postgres = _postgres_pid(workdir)
                pids = {"api": api_pid, "worker": worker.pid, "postgres": postgres}
                yield api_url, admin_key, dsn, pids, api
            finally:
                api.stop()


def _postgres_pid(workdir: Path) -> int:
    pidfile = next(workdir.glob("postgres/**/postmaster.pid"))
    return int(pidfile.read_text().splitlines()[0])


async def false_transitions(dsn: str, since: float) -> int:
    connection = await asyncpg.connect(dsn)
    try:
        count: int = await connection.fetchval(
            "SELECT count(*) FROM outbox WHERE envelope->>'action' = 'node.liveness.changed'"
            " AND envelope->'data'->>'current' IN ('stale', 'offline')"
            " AND created_at >= to_timestamp($1)",
            since,
        )
    finally:
        await connection.close()
    return count


@dataclass
class Window:
    """CPU of each role over the measured steady state."""

    pids: dict[str, int]
    since: float = 0.0
    started: float = 0.0
    before: dict[str, float] | None = None
    cpu: dict[str, float] | None = None
    seconds: float = 0.0

    def _now(self, extra: dict[str, list[int]]) -> dict[str, float]:
        groups = {role: tree(pid) for role, pid in self.pids.items()} | extra
        return {role: cpu_seconds(p) for role, p in groups.items()}

    def open(self, generators: list[int]) -> None:
        self.since = time.time()
        self.started = time.monotonic()
        self.before = self._now({"generator": generators})

    def close(self, generators: list[int]) -> None:
        assert self.before is not None
        after = self._now({"generator": generators})
        self.seconds = time.monotonic() - self.started
        self.cpu = {role: after[role] - self.before[role] for role in after}


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
        "node_id": node.node_id, "sequence": 1, "observed_at": _utc_now(), "complete": True,
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


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


async def _enroll_with_inventory(
    api_url: str, admin_key: str, nodes: int
) -> tuple[list[hb.Node], dict[str, list[str]]]:
    fleet = await hb.enroll_nodes(api_url, admin_key, nodes, concurrency=32)
    gpus = {node.node_id: [f"GPU-{node.node_id}-{i}" for i in range(2)] for node in fleet}
    gate = asyncio.Semaphore(32)

    async def send(client: httpx.AsyncClient, node: hb.Node) -> None:
        async with gate:
            response = await client.put(
                INVENTORY,
                json=_inventory(node, gpus[node.node_id]),
                headers={"Authorization": f"Bearer {node.credential}"},
            )
            response.raise_for_status()

    async with hb.async_client(api_url, 32) as client:
        await asyncio.gather(*(send(client, node) for node in fleet))
    return fleet, gpus


def _transactional_heartbeats(api_url: str) -> float:
    metrics = httpx.get(f"{api_url}/metrics", timeout=10).text
    return _metric(metrics, "modelforge_heartbeats_total", path="transactional")


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
    window.open([proc.pid for proc in measured])
    time.sleep(max(0.0, args.duration - 2))
    window.close([proc.pid for proc in measured])
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


def run_size(
    nodes: int, args: argparse.Namespace, workdir: Path, env: dict[str, str]
) -> SizeResult:
    with stack(workdir, env, args.api_processes) as (api_url, admin_key, dsn, pids, api):
        window = Window(pids)
        if args.driver == "wrk":
            driven = drive_wrk(nodes, args, api_url, admin_key, workdir, window)
        else:
            driven = drive_simulate(nodes, args, api_url, admin_key, workdir, env, window)
        api_rss = sum(rss_mib(pid) for pid in tree(pids["api"]))
        metrics = httpx.get(f"{api_url}/metrics", timeout=10).text
        falses = asyncio.run(false_transitions(dsn, window.since))
        storm = None
        if args.return_storm:
            assert driven.fleet_for is not None, "the return storm needs --driver wrk"
            storm = return_storm(nodes, api, api_url, dsn, driven.fleet_for)
    routine = _metric(metrics, "modelforge_heartbeats_total", path="routine")
    transactional = _metric(metrics, "modelforge_heartbeats_total", path="transactional")
    assert window.cpu is not None
    return SizeResult(
        nodes=nodes,
        enrolled=driven.enrolled,
        enroll_s=driven.enroll_s,
        steady_s=window.seconds,
        p50_ms=driven.p50_ms,
        p99_ms=driven.p99_ms,
        heartbeats=driven.heartbeats,
        errors=driven.errors,
        false_transitions=falses,
        cpu=window.cpu,
        api_rss_mib=api_rss,
        routine_share=routine / (routine + transactional) if routine + transactional else 0.0,
        settle_s=driven.settle_s,
        error_kinds=driven.error_kinds,
        storm=storm,
        telemetry_ms=driven.telemetry_ms,
        loop=loop_figures.loop_line(metrics),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1000,2500,5000,10000")
    parser.add_argument("--duration", type=float, default=300.0, help="steady seconds per size")
    parser.add_argument("--telemetry-interval", type=float, default=20.0)
    parser.add_argument(
        "--warmup", type=float, default=30.0, help="seconds of the steady state not timed"
    )
    parser.add_argument("--per-process", type=int, default=2500, help="nodes per simulator")
    parser.add_argument(
        "--return-storm",
        action="store_true",
        help="after the steady state, stop the API for 2x the offline threshold and time"
        " the fleet's return (wrk driver)",
    )
    parser.add_argument(
        "--api-processes",
        type=int,
        default=1,
        help="`modelforge api --processes` (default 1; /metrics sums the processes)",
    )
    parser.add_argument("--concurrency", type=int, default=64, help="per simulator")
    parser.add_argument(
        "--driver",
        choices=["simulate", "wrk"],
        default="simulate",
        help="simulate: `modelforge simulate` processes (the agent's own code);"
        " wrk: paced wrk (ops/bench/wrk_fleet.py), a generator that is not the bottleneck",
    )
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELFORGE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hb.ROOT), env.get("PYTHONPATH")]))
    results = []
    for size in (int(s) for s in args.sizes.split(",")):
        workdir = Path(tempfile.mkdtemp(prefix=f"mf-bench-fleet-{size}-"))
        try:
            result = run_size(size, args, workdir, env)
        except Exception:
            print(f"{size} nodes failed; logs are kept in {workdir}", file=sys.stderr)
            raise
        shutil.rmtree(workdir, ignore_errors=True)
        results.append(result)
        print("\n".join(result.lines()), flush=True)
    print(f"\n{os.cpu_count()} CPUs shared by the stack and the simulators")
    return 0


if __name__ == "__main__":
    sys.exit(main())
