"""The pipeline on a 3-server JetStream cluster: R3 streams and consumers, two API
processes, two worker processes, and one nats-server SIGKILLed mid-load.

Under steady load through both APIs (inventory reports that move GPUs around, operator
edits), the server that leads the events stream, made the leader of every other stream
and consumer too, is killed with SIGKILL (with one worker too, in the second test) and
started again. Every consumer keeps going on the two
servers left, and afterwards: every committed event is on the stream once and has its
one audit row, every node's GPUs are what its last report says (with exactly the GPU
events a sequential reconciler emits), every durable consumer is drained, and every
stream and consumer is back to three current replicas. `/readyz` of both APIs says
ready all along: the cluster still serves. The readiness test checks the other side:
with every server down it says not ready, and ready again once they are back.
"""

from __future__ import annotations

import collections
import contextlib
import json
import random
import signal
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.js.api import ConsumerInfo, Placement, StreamInfo

from api.broker_link import BrokerLink
from broker.jetstream import BrokerSettings, Names
from broker.jetstream.connection import connect
from broker.jetstream.declare import (
    dead_letter_stream_config,
    queue_consumer_config,
    tasks_stream_config,
)
from broker.jetstream.settings import nats_servers
from schemas.events import CloudEvent
from schemas.protocol import EVENTS_STREAM, INVENTORY, NODES, READYZ
from stack.nats_cluster import NatsCluster
from tests.admin_helpers import db_scalar
from tests.agent.harness import wait_until
from tests.api_processes import ADMIN, api_processes, enrolled
from tests.api_server import PRESENCE_GAP_S
from tests.flows import gpu, inventory_body
from tests.pipeline import settle
from tests.services import run_async
from tests.test_pipeline_crash import GPU_POOL, assert_exactly_once, gpus_converged
from tests.worker_processes import OFFLINE_S, STALE_S, Workers, worker_env
from workers.consumer import EventConsumer
from workers.relay import connect_nats
from workers.settings import WorkerSettings

NODE_COUNT = 6
REPLICAS = 3
# Audit rows that must land between the steps of a fault: load on both sides of it.
PROGRESS = 30


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    """Three clustered nats-servers (JetStream) from the wheel, private to this test."""
    with NatsCluster(tmp_path / "nats", size=REPLICAS) as cluster:
        yield cluster


# --- the cluster, as the JetStream API reports it ----------------------------------------


@dataclass(frozen=True)
class Snapshot:
    streams: dict[str, StreamInfo]
    consumers: dict[tuple[str, str], ConsumerInfo]


def snapshot(cluster: NatsCluster) -> Snapshot:
    """Every stream and durable consumer of the cluster, from whichever server answers."""

    async def read() -> Snapshot:
        nc = await nats.connect(servers=cluster.urls, connect_timeout=2, allow_reconnect=False)
        try:
            js = nc.jetstream(timeout=5)
            streams = {info.config.name or "": info for info in await js.streams_info()}
            consumers = {
                (name, info.name): info
                for name in streams
                for info in await js.consumers_info(name)
            }
            return Snapshot(streams, consumers)
        finally:
            await nc.close()

    return run_async(read, timeout_s=30)


def stream_leader(cluster: NatsCluster, stream: str) -> str:
    def elected() -> str | None:
        try:
            info = snapshot(cluster).streams.get(stream)
        except (OSError, TimeoutError, nats.errors.Error):
            return None
        return leader(info) if info is not None else None

    return wait_until(elected, 30, f"a leader of {stream}")


def leader(info: StreamInfo | ConsumerInfo) -> str | None:
    return info.cluster.leader if info.cluster is not None else None


def lead_everything_from(cluster: NatsCluster, victim: str) -> None:
    """Move the leader of every stream and consumer onto `victim` (a leader stepdown
    that prefers it), so that killing it interrupts all of them at once."""

    async def step_down(subjects: list[str]) -> None:
        nc = await nats.connect(servers=cluster.urls, connect_timeout=2, allow_reconnect=False)
        try:
            body = json.dumps({"placement": {"preferred": victim}}).encode()
            for subject in subjects:
                with contextlib.suppress(nats.errors.Error):
                    await nc.request(subject, body, timeout=5)
        finally:
            await nc.close()

    def moved() -> bool:
        state = snapshot(cluster)
        subjects = [
            f"$JS.API.STREAM.LEADER.STEPDOWN.{name}"
            for name, info in state.streams.items()
            if leader(info) != victim
        ] + [
            f"$JS.API.CONSUMER.LEADER.STEPDOWN.{stream}.{durable}"
            for (stream, durable), info in state.consumers.items()
            if leader(info) != victim
        ]
        if subjects:
            run_async(lambda: step_down(subjects), timeout_s=60)
        return not subjects

    wait_until(moved, 60, f"every stream and consumer led by {victim}")


def delivered(consumer: ConsumerInfo) -> int:
    """The last stream sequence this consumer delivered."""
    return consumer.delivered.stream_seq if consumer.delivered is not None else 0


def replicas_current(cluster: NatsCluster) -> str | None:
    """None when every stream and consumer has all its replicas caught up, else what not."""
    state = snapshot(cluster)
    infos: list[tuple[str, Any]] = [
        *((f"stream {name}", info) for name, info in state.streams.items()),
        *((f"consumer {name}", info) for name, info in state.consumers.items()),
    ]
    for what, info in infos:
        peers = (info.cluster.replicas or []) if info.cluster is not None else []
        if info.cluster is None or info.cluster.leader is None or len(peers) != REPLICAS - 1:
            return f"{what}: {info.cluster}"
        if not all(peer.current and not peer.offline for peer in peers):
            return f"{what}: {info.cluster}"
    return None


# --- load and probes ---------------------------------------------------------------------


class Load:
    """Inventory reports and operator edits from a thread, spread over every API."""

    def __init__(self, urls: list[str], nodes: list[tuple[str, str]]) -> None:
        self.urls = urls
        self.nodes = nodes
        self.reports: dict[str, list[list[str]]] = collections.defaultdict(list)
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._random = random.Random(11)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        assert self.failure is None, repr(self.failure)

    def _run(self) -> None:
        clients = [httpx.Client(base_url=url, timeout=10, trust_env=False) for url in self.urls]
        try:
            turn = 0
            while not self._stop.is_set():
                for node_id, credential in self.nodes:
                    turn += 1
                    client = clients[turn % len(clients)]
                    uuids = self._random.sample(GPU_POOL, self._random.randint(0, len(GPU_POOL)))
                    body = inventory_body(
                        node_id,
                        len(self.reports[node_id]) + 1,
                        gpus=[gpu(GPU_POOL.index(u), u) for u in uuids],
                    )
                    auth = {"Authorization": f"Bearer {credential}"}
                    response = client.put(INVENTORY, json=body, headers=auth)
                    assert response.status_code == 200, response.text
                    assert response.json()["applied"] is True
                    self.reports[node_id].append(uuids)
                    response = clients[(turn + 1) % len(clients)].patch(
                        f"{NODES}/{node_id}", json={"display_name": f"edit-{turn}"}, headers=ADMIN
                    )
                    assert response.status_code == 200, response.text
        except BaseException as exc:
            self.failure = exc
        finally:
            for client in clients:
                client.close()


@dataclass
class Probe:
    at: float
    url: str
    status: int
    body: dict[str, Any]


@dataclass
class Readiness:
    """/readyz of every API, polled from a thread while the test runs."""

    urls: list[str]
    probes: list[Probe] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Readiness:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        with httpx.Client(timeout=10, trust_env=False) as client:
            while not self._stop.wait(0.1):
                for url in self.urls:
                    response = client.get(f"{url}{READYZ}")
                    self.probes.append(
                        Probe(time.monotonic(), url, response.status_code, response.json())
                    )

    def wait_for_more(self, count: int, timeout_s: float = 30) -> None:
        """Until `count` more probes have been answered."""
        target = len(self.probes) + count
        wait_until(lambda: len(self.probes) >= target, timeout_s, f"{count} more probes")

    def not_ready(self) -> list[Probe]:
        return [p for p in self.probes if p.status != 200 or p.body["nats"] != "ok"]


def readyz(url: str) -> tuple[int, dict[str, Any]]:
    response = httpx.get(f"{url}{READYZ}", timeout=10, trust_env=False)
    body: dict[str, Any] = response.json()
    assert body["ready"] is (response.status_code == 200), body
    return response.status_code, body


def wait_for_readyz(url: str, status: int, timeout_s: float = 30) -> dict[str, Any]:
    def answered() -> dict[str, Any] | None:
        seen, body = readyz(url)
        return body if seen == status else None

    return wait_until(answered, timeout_s, f"/readyz {status}")


# --- the scenario ------------------------------------------------------------------------


def audited(database_url: str) -> int:
    return int(db_scalar(database_url, "SELECT count(*) FROM audit_log"))


def progressed(database_url: str, what: str, timeout_s: float = 60) -> int:
    """Wait until PROGRESS more audit rows have been written; the count then."""
    start = audited(database_url)
    return wait_until(
        lambda: (n := audited(database_url)) >= start + PROGRESS and n,
        timeout_s,
        f"{PROGRESS} audit rows {what}",
    )


def assert_converged(api_url: str, database_url: str, load: Load) -> None:
    with httpx.Client(base_url=api_url, timeout=10, trust_env=False) as client:
        gpus_converged(client, ADMIN, database_url, load.reports, list(load.reports))


def run_with_server_killed(
    cluster: NatsCluster, database_url: str, tmp_path: Path, *, kill_worker: bool
) -> None:
    env = worker_env(database_url, cluster.url, f"t{uuid.uuid4().hex[:8]}")
    env["MODELFORGE_REPLICAS"] = str(REPLICAS)
    workers = Workers(env, tmp_path)
    with api_processes(
        2,
        database_url,
        cluster.url,
        tmp_path,
        stale_after_s=str(STALE_S),
        offline_after_s=str(OFFLINE_S),
        presence_gap_s=str(PRESENCE_GAP_S),
    ) as apis:
        urls = [url for url, _ in apis]
        try:
            workers.start(2)
            with httpx.Client(base_url=urls[0], timeout=10, trust_env=False) as operator:
                nodes = [enrolled(operator, f"cluster-{i}") for i in range(NODE_COUNT)]
            # The workers are up once the enrollments' events are audited.
            settle(database_url, timeout_s=60)
            with Readiness(urls) as readiness, Load(urls, nodes) as load:
                progressed(database_url, "before the fault")
                victim = cluster.server(stream_leader(cluster, EVENTS_STREAM))
                lead_everything_from(cluster, victim.name)
                before = snapshot(cluster)
                victim.kill()
                if kill_worker:
                    workers.procs[0].send_signal(signal.SIGKILL)
                    workers.procs[0].wait(timeout=10)
                progressed(database_url, f"with {victim.name} down")
                assert stream_leader(cluster, EVENTS_STREAM) != victim.name
                cluster.restart(victim)
                if kill_worker:
                    workers.start(1)
                progressed(database_url, f"after {victim.name} came back")
            assert sum(len(r) for r in load.reports.values()) > 3 * NODE_COUNT
            # A killed worker's unacked events come back after the consumers' ack wait.
            settle(database_url, timeout_s=90)
            assert not readiness.not_ready(), readiness.not_ready()[:5]
            assert len({p.url for p in readiness.probes}) == 2
            assert_converged(urls[0], database_url, load)
        finally:
            workers.stop_all()
    logs = workers.logs() + "".join(p.read_text() for p in tmp_path.glob("api-*.log"))
    assert "Traceback" not in logs
    # A consumer without a leader is waited out (one line each time), not pulled in a
    # tight loop (thousands of lines).
    assert "unexpected pull status" not in logs
    assert logs.count("no responders") <= 40
    assert_exactly_once(database_url)
    duplicates = "SELECT count(*) - count(DISTINCT event_id) FROM audit_log"
    assert db_scalar(database_url, duplicates) == 0

    wait_until(lambda: replicas_current(cluster) is None, 60, "every replica current")
    after = snapshot(cluster)
    outbox = db_scalar(database_url, "SELECT count(*) FROM outbox")
    events = after.streams[EVENTS_STREAM]
    # Nothing lost and nothing twice on the stream, whatever the relay republished.
    assert events.state.messages == outbox
    for name, stream in after.streams.items():
        assert stream.config.num_replicas == REPLICAS, name
    assert {durable for stream, durable in after.consumers if stream == EVENTS_STREAM} == {
        "audit",
        "reconcile",
    }
    queues = {durable for stream, durable in after.consumers if stream != EVENTS_STREAM}
    assert {"tasks-liveness", "tasks-leases", "tasks-deployments"} <= queues, queues
    for key, consumer in after.consumers.items():
        # Every consumer kept going: drained, and past where it was before the fault.
        assert consumer.num_pending == 0 and consumer.num_ack_pending == 0, (key, consumer)
        assert delivered(consumer) > delivered(before.consumers[key]), key


@pytest.mark.slow
def test_stream_leader_killed_under_load_loses_and_duplicates_nothing(
    nats_cluster: NatsCluster, database_url: str, tmp_path: Path
) -> None:
    run_with_server_killed(nats_cluster, database_url, tmp_path, kill_worker=False)


@pytest.mark.slow
def test_stream_leader_and_a_worker_killed_together(
    nats_cluster: NatsCluster, database_url: str, tmp_path: Path
) -> None:
    run_with_server_killed(nats_cluster, database_url, tmp_path, kill_worker=True)


@pytest.mark.slow
def test_readyz_on_a_cluster_is_ready_with_a_server_down_and_not_with_all(
    nats_cluster: NatsCluster, database_url: str, tmp_path: Path
) -> None:
    with api_processes(1, database_url, nats_cluster.url, tmp_path) as [(url, _)]:
        wait_for_readyz(url, 200)
        with Readiness([url]) as readiness:
            # One server after the other goes, and comes back: two of three always serve.
            for server in nats_cluster.servers:
                server.kill()
                readiness.wait_for_more(5)
                nats_cluster.restart(server)
        assert not readiness.not_ready(), readiness.not_ready()[:5]
        for server in nats_cluster.servers:
            server.kill()
        body = wait_for_readyz(url, 503)
        assert body["nats"] == "unreachable" and body["database"] == "ok", body
        nats_cluster.restart(*nats_cluster.servers)
        assert wait_for_readyz(url, 200)["nats"] == "ok"


@pytest.mark.slow
def test_a_worker_started_without_quorum_waits_and_then_consumes(
    nats_cluster: NatsCluster, database_url: str, tmp_path: Path
) -> None:
    """Two servers of three down: JetStream cannot answer, and a worker that starts then
    used to exit after nats-py's 5 s timeout. It waits (one line per wait, no
    traceback) and starts consuming once quorum is back."""
    namespace = f"t{uuid.uuid4().hex[:8]}"
    env = worker_env(database_url, nats_cluster.url, namespace)
    env["MODELFORGE_REPLICAS"] = str(REPLICAS)
    env["MODELFORGE_JETSTREAM_WAIT_MAX_S"] = "2"
    down = nats_cluster.servers[1:]
    for server in down:
        server.kill()
    workers = Workers(env, tmp_path)
    waiting = "JetStream is not ready"

    def waited(times: int) -> bool:
        assert workers.procs[0].poll() is None, f"the worker exited:\n{workers.logs()}"
        return workers.logs().count(waiting) >= times

    def liveness_consumed() -> bool:
        assert workers.procs[0].poll() is None, f"the worker exited:\n{workers.logs()}"
        try:
            consumers = snapshot(nats_cluster).consumers
        except (OSError, TimeoutError, nats.errors.Error):
            return False
        info = consumers.get((Names(namespace).tasks_stream, "tasks-liveness"))
        return info is not None and delivered(info) > 0

    try:
        workers.start(1)
        # Three waits: past nats-py's 5 s API timeout, where the worker used to exit.
        wait_until(lambda: waited(3), 90, "the worker waiting for JetStream")
        nats_cluster.restart(*down)
        wait_until(liveness_consumed, 90, "the worker consuming once quorum is back")
        assert "worker 0 running" in workers.logs()
    finally:
        workers.stop_all()
    logs = workers.logs()
    assert "Traceback" not in logs, logs
    assert "did not finish within" not in logs.split("worker 0 running")[0], logs


@pytest.mark.fast
def test_cluster_settings_reach_every_stream_and_consumer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MODELFORGE_NATS_URL", " nats://a:4222, nats://b:4222,,nats://c:4222")
    monkeypatch.setenv("MODELFORGE_DATABASE_URL", "postgresql+asyncpg://unused/db")
    monkeypatch.setenv("MODELFORGE_REPLICAS", "3")
    monkeypatch.setenv("MODELFORGE_PLACEMENT_CLUSTER", "east")
    monkeypatch.setenv("MODELFORGE_PLACEMENT_TAGS", "ssd, gpu-plane")
    broker = BrokerSettings()
    assert broker.servers == ["nats://a:4222", "nats://b:4222", "nats://c:4222"]
    assert nats_servers(broker.nats_url) == broker.servers
    names = Names(broker.namespace)
    worker = WorkerSettings()
    configs = [
        tasks_stream_config(names, broker),
        dead_letter_stream_config(names, broker),
        worker.events_stream().config(),
    ]
    for config in configs:
        assert config.num_replicas == 3, config.name
        assert config.placement == Placement(cluster="east", tags=["ssd", "gpu-plane"])
    # Durable consumers leave their replicas to the stream (0 on the wire: inherit).
    assert queue_consumer_config(names, broker, "liveness").num_replicas is None
    assert (
        EventConsumer("audit", "modelforge.v1.>", _refuse, _no_nats).config().num_replicas is None
    )

    for unset in (
        "MODELFORGE_REPLICAS",
        "MODELFORGE_PLACEMENT_CLUSTER",
        "MODELFORGE_PLACEMENT_TAGS",
    ):
        monkeypatch.delenv(unset)
    single = WorkerSettings().events_stream().config()
    assert single.num_replicas == 1 and single.placement is None
    with pytest.raises(ValueError, match="no NATS server"):
        nats_servers(" , ")


async def _refuse(events: Sequence[CloudEvent]) -> None:
    raise AssertionError("not consumed here")


async def _no_nats() -> NatsClient:
    raise AssertionError("not connected here")


def test_clients_reach_the_cluster_through_any_listed_server(nats_cluster: NatsCluster) -> None:
    """With the first listed server down, every kind of connection ModelForge opens
    (the relay's and consumers', the broker's, the API's) reaches one of the others."""
    nats_cluster.servers[0].kill()

    async def connect_all() -> list[str]:
        reached: list[str] = []
        for _ in range(6):  # nats-py shuffles the list: the dead one comes first sometimes
            nc = await connect_nats(nats_cluster.url)
            reached.append(str(nc.connected_url.netloc if nc.connected_url else ""))
            await nc.close()
        settings = BrokerSettings(nats_url=nats_cluster.url, connect_timeout_s=5)
        nc = await connect(settings, "test")
        await nc.close()
        link = BrokerLink(nats_cluster.url, timeout_s=2)
        try:
            assert await link.ping(5)
        finally:
            await link.close()
        return reached

    reached = run_async(connect_all, timeout_s=60)
    dead = nats_cluster.servers[0].url.removeprefix("nats://")
    assert reached and dead not in reached
