"""Audit and reconciliation in real worker processes survive a SIGKILL and a NATS outage.

Under steady load (inventory reports that move GPUs around, operator edits), one worker
is killed with SIGKILL and started again, or the broker is stopped and started again.
Afterwards every committed change has exactly one audit row, and every node's GPUs are
what its last report says, with exactly the GPU events a sequential reconciler emits.
"""

from __future__ import annotations

import collections
import random
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping

import httpx
import pytest

from schemas.events import NOT_AUDITED, OPERATOR_ACTOR, EventType, NodeUpdated
from schemas.protocol import INVENTORY, NODES
from stack.embedded_nats import EmbeddedNats
from store import changes
from store.engine import make_engine, make_sessionmaker
from tests.admin_helpers import audit, db_scalar
from tests.api_server import ApiFactory, RunningApi
from tests.flows import EnrolledNode, enroll, gpu, inventory_body
from tests.gpu_reference import GpuReference
from tests.pipeline import settle
from tests.services import db_fetch, run_async
from tests.worker_processes import Workers

NODE_COUNT = 8
GPU_POOL = ["GPU-crash-a", "GPU-crash-b", "GPU-crash-c"]


class Load:
    """Inventory reports and operator edits from a thread, until stopped."""

    def __init__(self, api: RunningApi, nodes: list[EnrolledNode]) -> None:
        self.api = api
        self.nodes = nodes
        self.reports: dict[str, list[list[str]]] = collections.defaultdict(list)
        self.edits = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._random = random.Random(7)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        with self.api.client() as client:
            while not self._stop.is_set():
                for node in self.nodes:
                    uuids = self._random.sample(GPU_POOL, self._random.randint(0, len(GPU_POOL)))
                    sequence = len(self.reports[node.node_id]) + 1
                    body = inventory_body(
                        node.node_id,
                        sequence,
                        gpus=[gpu(GPU_POOL.index(u), u) for u in uuids],
                    )
                    response = client.put(INVENTORY, json=body, headers=node.headers)
                    assert response.status_code == 200, response.text
                    assert response.json()["applied"] is True
                    self.reports[node.node_id].append(uuids)
                edited = self.nodes[self.edits % len(self.nodes)]
                response = client.patch(
                    f"{NODES}/{edited.node_id}",
                    json={"display_name": f"edit-{self.edits}"},
                    headers=self.api.admin_headers,
                )
                assert response.status_code == 200, response.text
                self.edits += 1


def expected_gpu_events(reports: list[list[str]]) -> collections.Counter[tuple[str, str]]:
    """What a sequential reconciler emits for these complete reports: (action, GPU)."""
    reference = GpuReference()
    for uuids in reports:
        reference.apply([(u, GPU_POOL.index(u)) for u in uuids])
    return reference.events


def assert_exactly_once(database_url: str) -> None:
    audited = db_scalar(
        database_url,
        "SELECT count(*) FROM outbox WHERE NOT (envelope->>'action' = ANY(:skip))",
        skip=sorted(NOT_AUDITED),
    )
    assert audited > 0
    assert db_scalar(database_url, "SELECT count(*) FROM audit_log") == audited
    # Row for row: every audited event has its one row, and no row lacks its event.
    joined = db_scalar(
        database_url, "SELECT count(*) FROM outbox o JOIN audit_log a ON a.event_id = o.id"
    )
    assert joined == audited


def gpus_converged(
    client: httpx.Client,
    admin_headers: Mapping[str, str],
    database_url: str,
    reports: Mapping[str, list[list[str]]],
    node_ids: Iterable[str],
) -> None:
    """Each node's GPUs are its last report's, its inventory stream took every report,
    and its GPU events are a sequential reconciler's (expected_gpu_events)."""
    node_ids = list(node_ids)
    for node_id in node_ids:
        sent = reports[node_id]
        assert sent, "the load never reached this node"
        detail = client.get(f"{NODES}/{node_id}", headers=dict(admin_headers)).json()
        present = {g["uuid"] for g in detail["gpus"] if not g["missing"]}
        assert present == set(sent[-1]), node_id
        assert detail["inventory_stream"]["good_sequence"] == len(sent)
    rows = run_async(
        lambda: db_fetch(
            database_url,
            "SELECT envelope->'data'->>'node_id' AS node, envelope->>'action' AS action,"
            " envelope->'data'->>'gpu_uuid' AS gpu FROM outbox"
            " WHERE envelope->>'action' LIKE 'node.gpu.%'",
        )
    )
    actual: dict[str, collections.Counter[tuple[str, str]]] = collections.defaultdict(
        collections.Counter
    )
    for row in rows:
        actual[row["node"]][row["action"], row["gpu"]] += 1
    for node_id in node_ids:
        assert actual[node_id] == expected_gpu_events(reports[node_id]), node_id


def assert_converged(api: RunningApi, database_url: str, load: Load) -> None:
    with api.client() as client:
        nodes = [node.node_id for node in load.nodes]
        gpus_converged(client, api.admin_headers, database_url, load.reports, nodes)


def _run_with_fault(
    api_factory: ApiFactory,
    workers: Workers,
    nats_server: EmbeddedNats,
    database_url: str,
    fault: Callable[[], None],
) -> None:
    api = api_factory(pipeline=False, nats_url=nats_server.url)
    workers.start(2)
    with api.client() as client:
        nodes = [enroll(client, api, hostname=f"crash-{i}") for i in range(NODE_COUNT)]
    with Load(api, nodes) as load:
        # Pacing: the fault lands mid-load, with load on both sides of it.
        time.sleep(2.0)
        fault()
        time.sleep(2.0)
    assert sum(len(r) for r in load.reports.values()) > 3 * NODE_COUNT
    # A killed worker's unacked messages return after the consumers' ack wait (3 s).
    settle(database_url, timeout_s=60)
    assert_exactly_once(database_url)
    assert_converged(api, database_url, load)


@pytest.mark.slow
def test_sigkill_of_a_busy_worker_loses_and_duplicates_nothing(
    api_factory: ApiFactory, workers: Workers, nats_server: EmbeddedNats, database_url: str
) -> None:
    def kill_and_restart() -> None:
        workers.procs[0].send_signal(signal.SIGKILL)
        workers.procs[0].wait(timeout=10)
        time.sleep(0.5)  # a while with one worker fewer: part of the fault
        workers.start(1)

    _run_with_fault(api_factory, workers, nats_server, database_url, kill_and_restart)
    assert "Traceback" not in workers.logs()


@pytest.mark.slow
def test_nats_outage_under_load_loses_and_duplicates_nothing(
    api_factory: ApiFactory, workers: Workers, nats_server: EmbeddedNats, database_url: str
) -> None:
    def outage() -> None:
        nats_server.stop()
        time.sleep(2.0)  # the outage's length: part of the fault
        nats_server.start()

    _run_with_fault(api_factory, workers, nats_server, database_url, outage)


async def test_a_rolled_back_change_never_reaches_the_audit_log(
    api_factory: ApiFactory, database_url: str
) -> None:
    api = api_factory()
    with api.client() as client:
        node = enroll(client, api)
    engine = make_engine(database_url, pool_size=1)
    try:
        sessions = make_sessionmaker(engine)
        with pytest.raises(RuntimeError):
            async with sessions() as session, session.begin():
                rolled_back = changes.record(
                    session,
                    EventType.NODE_UPDATED,
                    NodeUpdated(
                        node_id=uuid.UUID(node.node_id), changes={"display_name": [None, "never"]}
                    ),
                    actor=OPERATOR_ACTOR,
                )
                await session.flush()
                raise RuntimeError("the request failed after writing its change")
    finally:
        await engine.dispose()
    with api.client() as client:
        response = client.patch(
            f"{NODES}/{node.node_id}", json={"display_name": "kept"}, headers=api.admin_headers
        )
        assert response.status_code == 200, response.text
        rows = audit(client, api, action="node.updated", target_id=node.node_id)
    assert [row["details"]["changes"]["display_name"] for row in rows] == [[None, "kept"]]
    for table in ("outbox", "audit_log"):
        column = "id" if table == "outbox" else "event_id"
        sql = f"SELECT count(*) FROM {table} WHERE {column} = :id"  # noqa: S608
        assert db_scalar(database_url, sql, id=rolled_back) == 0
