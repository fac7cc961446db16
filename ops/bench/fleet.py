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
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import heartbeats as hb  # noqa: E402  (sibling bench module: processes, database)
import loop_figures  # noqa: E402
from fleet_drive import drive_simulate, drive_wrk  # noqa: E402
from fleet_stack import Window, false_transitions, metric, rss_mib, stack, tree  # noqa: E402
from fleet_storm import Storm, return_storm  # noqa: E402


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
    # Node requests the API refused 429 overloaded (api/shedding.py), warm-up included:
    # counted among wrk's non-2xx errors too.
    shed: float = 0.0
    steady_gc: str = ""

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
            *([f"  shed (429 overloaded, among the errors): {self.shed:.0f}"] if self.shed else []),
            f"  false stale/offline transitions: {self.false_transitions}",
            f"  CPU s per 1,000 nodes per minute: {cpu}; API RSS {self.api_rss_mib:.0f} MiB",
            *([f"  API: {self.loop}"] if self.loop else []),
            *([f"  API: {self.steady_gc}"] if self.steady_gc else []),
            *([self.storm.line()] if self.storm else []),
        ]


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
    routine = metric(metrics, "modelforge_heartbeats_total", path="routine")
    transactional = metric(metrics, "modelforge_heartbeats_total", path="transactional")
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
        steady_gc=driven.steady_gc,
        shed=sum(
            float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("modelforge_requests_shed_total{")
        ),
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
