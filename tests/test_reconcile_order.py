"""Reconciliation converges however the stream delivers (hypothesis, stateful).

The API accepts inventory reports (ordering rules, tests/test_ordering_model.py); the
test plays the stream towards the real reconcile consumer's handler: any subset of the
node.inventory.accepted events so far, in any order, duplicated, or handed to two
replicas at once. The reference applies every accepted report in sequence order, once,
whenever any delivery happens, and the database must match it: GPUs, and exactly the
GPU events a sequential reconciler emits, never one twice.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Sequence

import httpx
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from schemas.events import CloudEvent
from store.engine import make_engine, make_sessionmaker
from tests.api_server import ApiFactory, RunningApi
from tests.flows import INVENTORY, NODES, enroll, gpu, inventory_body
from tests.gpu_reference import GpuReference
from tests.services import db_fetch, run_async
from workers import reconcile

GPU_POOL = [f"GPU-order-{i}" for i in range(4)]

reports = st.tuples(
    st.lists(st.sampled_from(GPU_POOL), unique=True, max_size=len(GPU_POOL)),
    st.permutations(range(len(GPU_POOL))),
    st.booleans(),
)
# Indexes into the accepted events so far (taken modulo their number): duplicates and
# any order allowed.
deliveries = st.lists(st.integers(0, 1000), min_size=1, max_size=6)


async def handle(database_url: str, batches: Sequence[Sequence[CloudEvent]]) -> None:
    """Each batch to its own replica (a handler of its own), all at once."""
    engine = make_engine(database_url, pool_size=len(batches) + 1)
    try:
        sessions = make_sessionmaker(engine)
        replicas = [reconcile.handler(sessions) for _ in batches]
        await asyncio.gather(*(r(b) for r, b in zip(replicas, batches, strict=True)))
    finally:
        await engine.dispose()


def machine(api: RunningApi, client: httpx.Client) -> type[RuleBasedStateMachine]:
    database_url = api.settings.database_url

    class DeliveryMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            node = enroll(client, api)
            self.node_id = node.node_id
            self.headers = node.headers
            self.sequence = 0
            self.pending: list[tuple[list[tuple[str, int]], bool]] = []
            self.reference = GpuReference()

        def accepted_events(self) -> list[CloudEvent]:
            rows = run_async(
                lambda: db_fetch(
                    database_url,
                    "SELECT envelope::text AS e FROM outbox WHERE subject = $1 ORDER BY position",
                    f"modelforge.v1.node.{self.node_id}.inventory.accepted",
                )
            )
            return [CloudEvent.model_validate(json.loads(row["e"])) for row in rows]

        def deliver(self, batches: list[list[CloudEvent]]) -> None:
            run_async(lambda: handle(database_url, batches))
            for reported, complete in self.pending:
                self.reference.apply(reported, complete)
            self.pending.clear()

        @rule(report=reports)
        def inventory(self, report: tuple[list[str], tuple[int, ...], bool]) -> None:
            uuids, indexes, complete = report
            reported = [(uuid, indexes[GPU_POOL.index(uuid)]) for uuid in uuids]
            self.sequence += 1
            body = inventory_body(
                self.node_id,
                self.sequence,
                complete=complete,
                gpus=[gpu(index, uuid) for uuid, index in reported],
            )
            response = client.put(INVENTORY, json=body, headers=self.headers)
            assert response.status_code == 200, response.text
            assert response.json()["applied"] is True
            self.pending.append((reported, complete))
            self.check()

        @rule(picks=deliveries)
        def deliver_some(self, picks: list[int]) -> None:
            events = self.accepted_events()
            if events:
                self.deliver([[events[p % len(events)] for p in picks]])
            self.check()

        @rule(picks=deliveries)
        def deliver_to_two_replicas_at_once(self, picks: list[int]) -> None:
            events = self.accepted_events()
            if events:
                batch = [events[p % len(events)] for p in picks]
                self.deliver([batch, list(reversed(batch))])
            self.check()

        def check(self) -> None:
            response = client.get(f"{NODES}/{self.node_id}", headers=api.admin_headers)
            assert response.status_code == 200, response.text
            actual = {g["uuid"]: (g["index"], g["missing"]) for g in response.json()["gpus"]}
            assert actual == self.reference.gpus
            rows = run_async(
                lambda: db_fetch(
                    database_url,
                    "SELECT envelope->>'action' AS action, envelope->'data'->>'gpu_uuid' AS gpu"
                    " FROM outbox WHERE subject LIKE $1",
                    f"modelforge.v1.node.{self.node_id}.gpu.%",
                )
            )
            assert Counter((r["action"], r["gpu"]) for r in rows) == self.reference.events

    return DeliveryMachine


def test_any_delivery_order_converges_on_the_sequential_result(api_factory: ApiFactory) -> None:
    # No pipeline: this test is the stream, and nothing else may reconcile meanwhile.
    api = api_factory(pipeline=False)
    with api.client() as client:
        run_state_machine_as_test(
            machine(api, client),
            settings=settings(
                max_examples=25,
                stateful_step_count=12,
                deadline=None,
                database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
            ),
        )
