"""Worker throughput (1 vs 2 processes) and heartbeat-stop -> offline-event delay.

    python ops/bench/worker_events.py [--nodes 300 --rounds 3] [--nats-cluster 3]

Starts embedded PostgreSQL and nats-server, the API and `modelforge worker` processes.
With --nats-cluster N, the throughput figures are measured again, in the same run and on
the same database and nodes, on an N-server JetStream cluster on loopback (R3 streams
and consumers, stack/nats_cluster.py) with its own API process, and set against the
single server's.

* Throughput: N online nodes are aged past the offline threshold in one UPDATE; the
  clock runs until every node's liveness.changed event reached a JetStream consumer
  (sweep + audit + outbox + relay + publish). Measured with one worker process, then
  two, in the same run; the ratio is what to compare (the machine is shared).
* Delay: nodes heartbeat once and stop; for each, how long after its offline threshold
  (server-received heartbeat time + offline_after_s) the offline event reached the
  consumer. Bounded by the sweep period plus relay polling.
* Audit lag: commit of a change (its outbox row) -> its audit row written by the audit
  consumer (audit_log.recorded_at), p50/p99 over the throughput rounds' events.
* Reconcile: every node sends one inventory report at once (new GPUs each round); the
  clock runs until every report is reconciled and every resulting event is audited
  (route + outbox + relay + reconcile consumer + audit consumer). Events/s counts the
  accepted reports and the GPU events they caused.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import nats
from nats.js.api import DeliverPolicy

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import heartbeats as hb  # noqa: E402  (sibling bench module: processes, database, enrollment)
from sqlalchemy import NullPool  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine  # noqa: E402

from broker.jetstream.settings import nats_servers  # noqa: E402
from schemas.protocol import INVENTORY, NODES  # noqa: E402
from store import audit  # noqa: E402

STALE_S = 5.0
OFFLINE_S = 10.0
SWEEP_PERIOD_S = 0.5
LIVENESS_SUBJECT = "modelforge.v1.node.*.liveness.changed"


@contextlib.contextmanager
def workers(count: int, env: dict[str, str], workdir: Path, label: str) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for i in range(count):
            log = workdir / f"worker-{label}-{count}-{i}.log"
            argv = [sys.executable, "-m", "cli.main", "worker", "--threads", "4"]
            stack.enter_context(hb.child(argv, env | {"MODELFORGE_METRICS_PORT": "0"}, log))
        time.sleep(3)  # boot: connect, declare, open the database
        yield


async def offline_events(nats_url: str, want: set[str], timeout_s: float) -> dict[str, float]:
    """node id -> arrival time (monotonic) of its next offline event."""
    nc = await nats.connect(servers=nats_servers(nats_url))
    arrived: dict[str, float] = {}
    try:
        sub = await nc.jetstream().subscribe(
            LIVENESS_SUBJECT, ordered_consumer=True, deliver_policy=DeliverPolicy.NEW
        )
        deadline = time.monotonic() + timeout_s
        while want - arrived.keys() and time.monotonic() < deadline:
            with contextlib.suppress(nats.errors.TimeoutError):
                message = await sub.next_msg(timeout=1)
                event = json.loads(message.data)
                if event["data"]["current"] == "offline" and event["nodeid"] in want:
                    arrived.setdefault(event["nodeid"], time.monotonic())
    finally:
        await nc.close()
    return arrived


async def beat_all(api_url: str, nodes: list[hb.Node]) -> dict[str, datetime]:
    """One heartbeat per node; node id -> server-received time."""
    async with hb.async_client(api_url, 16) as client:
        responses = await asyncio.gather(*(hb.send_heartbeat(client, n) for n in nodes))
    for response in responses:
        response.raise_for_status()
    return {
        n.node_id: datetime.fromisoformat(r.json()["received_at"])
        for n, r in zip(nodes, responses, strict=True)
    }


async def throughput(api_url: str, nats_url: str, dsn: str, nodes: list[hb.Node]) -> float:
    await beat_all(api_url, nodes)
    await asyncio.sleep(SWEEP_PERIOD_S * 3)  # the online transitions settle first
    want = {n.node_id for n in nodes}
    listening = asyncio.create_task(offline_events(nats_url, want, 120))
    await asyncio.sleep(0.5)
    connection = await asyncpg.connect(dsn)
    try:
        started = time.monotonic()
        # Only nodes still online or stale: on a loaded box the heartbeats of one round
        # can take longer than OFFLINE_S, and the first nodes of it are then offline
        # already (their event went out before the listener started).
        aged = await connection.fetch(
            "UPDATE nodes SET last_heartbeat_at = now() - interval '1 hour'"
            " WHERE id = ANY($1::uuid[]) AND liveness <> 'offline' RETURNING id::text",
            list(want),
        )
    finally:
        await connection.close()
    want.intersection_update(row["id"] for row in aged)  # the listener's set, shrunk
    if len(want) < len(nodes):
        print(f"({len(nodes) - len(want)} of {len(nodes)} nodes were offline before aging)")
    arrived = {node: at for node, at in (await listening).items() if node in want}
    if len(arrived) != len(want):
        raise RuntimeError(f"only {len(arrived)} of {len(want)} offline events arrived")
    return len(want) / (max(arrived.values()) - started)


async def audit_lags(dsn: str, since: float) -> list[float]:
    """Seconds from outbox insert to audit row, for events committed after `since`."""
    connection = await asyncpg.connect(dsn)
    try:
        rows = await connection.fetch(
            "SELECT EXTRACT(EPOCH FROM a.recorded_at - o.created_at) AS lag FROM audit_log a"
            " JOIN outbox o ON o.id = a.event_id WHERE o.created_at >= to_timestamp($1)",
            since,
        )
    finally:
        await connection.close()
    return [float(row["lag"]) for row in rows]


async def _settled(engine: AsyncEngine) -> bool:
    async with engine.connect() as conn:
        return (await audit.backlog(conn)).settled


async def reconcile_round(
    api_url: str, database_url: str, nodes: list[hb.Node], round_: int
) -> float:
    """Events/s from the first report sent to the last event audited."""
    connection = await asyncpg.connect(database_url.replace("+asyncpg", ""))
    try:
        before = await connection.fetchval("SELECT count(*) FROM outbox")
        started = time.monotonic()
        async with hb.async_client(api_url, 16) as client:
            gate = asyncio.Semaphore(16)

            async def report(node: hb.Node) -> None:
                body = {
                    "node_id": node.node_id,
                    "sequence": round_,
                    "observed_at": datetime.now(UTC).isoformat(),
                    "complete": True,
                    "host": {
                        "hostname": "bench",
                        "os": "Linux",
                        "cpu_count": 8,
                        "ram_total_bytes": 2**36,
                    },
                    "gpus": [
                        {
                            "index": 0,
                            "uuid": f"GPU-{node.node_id}-{round_}",
                            "name": "Bench",
                            "pci_bus_id": "00000000:01:00.0",
                            "memory_total_bytes": 2**34,
                            "driver_version": "550",
                            "cuda_version": "12.4",
                        }
                    ],
                }
                auth = {"Authorization": f"Bearer {node.credential}"}
                async with gate:
                    response = await client.put(INVENTORY, json=body, headers=auth)
                response.raise_for_status()

            await asyncio.gather(*(report(n) for n in nodes))
        deadline = time.monotonic() + 120
        engine = create_async_engine(database_url, poolclass=NullPool)
        try:
            while not await _settled(engine):
                if time.monotonic() > deadline:
                    raise RuntimeError("reconciliation did not catch up in 120 s")
                await asyncio.sleep(0.02)
        finally:
            await engine.dispose()
        elapsed = time.monotonic() - started
        events = await connection.fetchval("SELECT count(*) FROM outbox") - before
    finally:
        await connection.close()
    return float(events) / elapsed


async def single_changes(
    api_url: str, admin_key: str, nodes: list[hb.Node], dsn: str
) -> list[float]:
    """Commit -> audit row of one change at a time on an otherwise idle stack."""
    since = time.time()
    async with hb.async_client(api_url, 1) as client:
        for i, node in enumerate(nodes):
            response = await client.patch(
                f"{NODES}/{node.node_id}",
                json={"display_name": f"lag-{i}"},
                headers={"X-ModelForge-Admin-Token": admin_key},
            )
            response.raise_for_status()
            await asyncio.sleep(0.25)
    await asyncio.sleep(2)
    return await audit_lags(dsn, since)


async def delays(api_url: str, nats_url: str, nodes: list[hb.Node]) -> list[float]:
    listening = asyncio.create_task(offline_events(nats_url, {n.node_id for n in nodes}, 60))
    await asyncio.sleep(0.5)
    received = await beat_all(api_url, nodes)
    wall_to_mono = time.monotonic() - time.time()
    arrived = await listening
    return [
        arrived[node_id] - (at.timestamp() + OFFLINE_S + wall_to_mono)
        for node_id, at in received.items()
        if node_id in arrived
    ]


@dataclasses.dataclass
class Figures:
    """One NATS backend's figures, each list a round's events/s (or lags in seconds)."""

    rates: dict[int, list[float]] = dataclasses.field(default_factory=dict)
    reconciled: dict[int, list[float]] = dataclasses.field(default_factory=dict)
    lags: dict[int, list[float]] = dataclasses.field(default_factory=dict)


class Rounds:
    """Inventory sequence numbers, increasing across backends (the nodes are shared)."""

    def __init__(self) -> None:
        self.last = 0

    def next(self) -> int:
        self.last += 1
        return self.last


def measure(
    args: argparse.Namespace,
    workdir: Path,
    common: dict[str, str],
    nats_url: str,
    label: str,
    nodes: list[hb.Node] | None,
    admin_key: str,
    rounds: Rounds,
    *,
    latency: bool,
) -> tuple[Figures, list[hb.Node], list[float], list[float]]:
    """The API and 1, then 2, worker processes on this NATS (one server or a cluster's
    list); the figures, the nodes (enrolled on the first call), and with latency the
    offline-event delays and one-change audit lags."""
    database_url = common["MODELFORGE_DATABASE_URL"]
    dsn = database_url.replace("postgresql+asyncpg://", "postgresql://")
    env = common | {"MODELFORGE_NATS_URL": nats_url}
    port = hb.free_port()
    api_url = f"http://127.0.0.1:{port}"
    api_env = env | {"MODELFORGE_OPERATOR_API_KEY": admin_key, "MODELFORGE_PORT": str(port)}
    log = workdir / f"api-{label}.log"
    figures = Figures()
    lag: list[float] = []
    idle: list[float] = []
    with hb.child([sys.executable, "-m", "cli.main", "api"], api_env, log) as api:
        hb.wait_healthy("the API", api_url, api, log)
        if nodes is None:
            nodes = asyncio.run(hb.enroll_nodes(api_url, admin_key, args.nodes, 16))
        for count in (1, 2):
            with workers(count, env, workdir, label):
                since = time.time()
                figures.rates[count] = [
                    asyncio.run(throughput(api_url, nats_url, dsn, nodes))
                    for _ in range(args.rounds)
                ]
                figures.lags[count] = asyncio.run(audit_lags(dsn, since))
                figures.reconciled[count] = [
                    asyncio.run(reconcile_round(api_url, database_url, nodes, rounds.next()))
                    for _ in range(args.rounds)
                ]
                if latency and count == 1:
                    lag = asyncio.run(delays(api_url, nats_url, nodes[:20]))
                    idle = asyncio.run(single_changes(api_url, admin_key, nodes[:20], dsn))
    return figures, nodes, lag, idle


def run(args: argparse.Namespace, workdir: Path) -> None:
    from stack.embedded_nats import EmbeddedNats
    from stack.nats_cluster import NatsCluster

    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELFORGE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hb.ROOT), env.get("PYTHONPATH")]))
    admin_key = secrets.token_urlsafe(24)
    rounds = Rounds()
    cluster: Figures | None = None
    with hb.database(workdir, True) as (database_url, where):
        common = env | {
            "MODELFORGE_DATABASE_URL": database_url,
            "MODELFORGE_STALE_AFTER_S": str(STALE_S),
            "MODELFORGE_OFFLINE_AFTER_S": str(OFFLINE_S),
            "MODELFORGE_SWEEP_PERIOD_S": str(SWEEP_PERIOD_S),
            "MODELFORGE_LOG_LEVEL": "WARNING",
            # Every node goes silent at once on purpose: the partition breaker would
            # (rightly) hold the offline transitions this measures.
            "MODELFORGE_PARTITION_MIN_NODES": "1000000",
        }
        with EmbeddedNats(workdir / "nats") as js:
            single, nodes, lag, idle = measure(
                args, workdir, common, js.url, "single", None, admin_key, rounds, latency=True
            )
        if args.nats_cluster:
            with NatsCluster(workdir / "nats-cluster", size=args.nats_cluster) as servers:
                replicas = {"MODELFORGE_REPLICAS": str(min(args.nats_cluster, 3))}
                cluster, *_ = measure(
                    args,
                    workdir,
                    common | replicas,
                    servers.url,
                    "cluster",
                    nodes,
                    admin_key,
                    rounds,
                    latency=False,
                )
    print(f"\n{args.nodes} nodes, {args.rounds} rounds each, {where}, {os.cpu_count()} CPUs shared")
    report("one nats-server", single)
    if cluster is not None:
        report(f"{args.nats_cluster}-server cluster, R{min(args.nats_cluster, 3)}", cluster)
        for count in (1, 2):
            live = statistics.median(cluster.rates[count]) / statistics.median(single.rates[count])
            rec = statistics.median(cluster.reconciled[count]) / statistics.median(
                single.reconciled[count]
            )
            print(
                f"cluster / one server, {count} worker process(es):"
                f" liveness {live:.2f}x, inventory -> reconciled + audited {rec:.2f}x"
            )
    idle.sort()
    print(
        f"commit -> audit row, one change at a time on an idle stack ({len(idle)} changes,"
        f" one server): p50 {idle[len(idle) // 2] * 1e3:.0f} ms, max {idle[-1] * 1e3:.0f} ms"
    )
    print(
        f"heartbeat stop -> offline event at a consumer, after the {OFFLINE_S:g} s threshold"
        f" (sweep period {SWEEP_PERIOD_S:g} s, {len(lag)} nodes, one server):"
        f" median {statistics.median(lag) * 1e3:.0f} ms, max {max(lag) * 1e3:.0f} ms"
    )


def report(backend: str, figures: Figures) -> None:
    print(f"-- {backend}")
    one, two = statistics.median(figures.rates[1]), statistics.median(figures.rates[2])
    for count, rate in ((1, one), (2, two)):
        rounds = [round(r) for r in figures.rates[count]]
        print(f"liveness events/s, {count} worker process(es): {rate:8.0f}  (rounds {rounds})")
    print(f"2 processes / 1 process: {two / one:.2f}x")
    for count in (1, 2):
        ordered = sorted(figures.lags[count])
        p50, p99 = ordered[len(ordered) // 2], ordered[int(len(ordered) * 0.99)]
        print(
            f"commit -> audit row, {count} worker process(es), {len(ordered)} events:"
            f" p50 {p50 * 1e3:.0f} ms, p99 {p99 * 1e3:.0f} ms"
        )
    r1, r2 = statistics.median(figures.reconciled[1]), statistics.median(figures.reconciled[2])
    for count, rate in ((1, r1), (2, r2)):
        rounds = [round(r) for r in figures.reconciled[count]]
        print(
            f"inventory -> reconciled + audited, events/s, {count} worker process(es):"
            f" {rate:8.0f}  (rounds {rounds})"
        )
    print(f"reconcile, 2 processes / 1 process: {r2 / r1:.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--nats-cluster",
        type=int,
        default=0,
        metavar="N",
        help="then again on an N-server JetStream cluster on loopback (R3 from 3 servers)",
    )
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="mf-bench-workers-"))
    try:
        run(args, workdir)
    except KeyboardInterrupt:
        return 130
    except Exception:
        print(f"failed; logs are kept in {workdir}", file=sys.stderr)
        raise
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
