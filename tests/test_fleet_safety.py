"""Fleet-level safety: restart grace after a control-plane outage, and the partition
breaker. Real API on loopback, real PostgreSQL, the real sweep; agents are heartbeat
loops over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from schemas.protocol import FLEET
from store.fleet import PartitionBreaker
from store.leases import LeasePolicy
from store.liveness import LivenessThresholds
from store.liveness_sweep import sweep
from tests.api_server import ApiFactory, RunningApi, api_on_thresholds
from tests.artifact_flows import ROOT, claimed, created, get_job, offer_roots
from tests.flows import HEARTBEAT, EnrolledNode, enroll, heartbeat_body
from tests.services import db_fetch
from workers.leases import expire

# The presence gap well inside the stale threshold, as in production (5 s and 30 s).
THRESHOLDS = LivenessThresholds(
    stale_after_s=1.5, offline_after_s=3.0, restart_grace_s=1.5, presence_gap_s=0.4
)
BREAKER = PartitionBreaker(share=0.3, min_nodes=10)


def start_api(api_factory: ApiFactory) -> RunningApi:
    return api_on_thresholds(api_factory, THRESHOLDS)


@dataclass
class Fleet:
    """Agents that heartbeat every `period_s` while not stopped, through whichever API
    is current; a refused or failed heartbeat is simply tried again next period."""

    api: RunningApi
    nodes: list[EnrolledNode]
    period_s: float = 0.25
    stopped: set[str] = field(default_factory=set)

    async def run(self, done: asyncio.Event) -> None:
        async with httpx.AsyncClient(timeout=5) as client:
            while not done.is_set():
                await asyncio.gather(*(self._beat(client, node) for node in self.live))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), self.period_s)

    @property
    def live(self) -> list[EnrolledNode]:
        return [n for n in self.nodes if n.node_id not in self.stopped]

    async def _beat(self, client: httpx.AsyncClient, node: EnrolledNode) -> None:
        with contextlib.suppress(httpx.HTTPError):
            await client.post(
                self.api.base_url + HEARTBEAT,
                json=heartbeat_body(node.node_id),
                headers=node.headers,
            )

    def stop(self, nodes: Iterable[EnrolledNode]) -> None:
        self.stopped |= {n.node_id for n in nodes}

    def resume(self) -> None:
        self.stopped.clear()


@contextlib.asynccontextmanager
async def running(*loops: Any) -> AsyncIterator[None]:
    done = asyncio.Event()
    tasks = [asyncio.create_task(loop(done)) for loop in loops]
    try:
        yield
    finally:
        done.set()
        await asyncio.gather(*tasks)


def sweeper(sessions: async_sessionmaker[AsyncSession], paused: asyncio.Event) -> Any:
    """The workers' periodic sweep, every 0.2 s, while `paused` is clear."""

    async def loop(done: asyncio.Event) -> None:
        while not done.is_set():
            if not paused.is_set():
                await sweep(sessions, THRESHOLDS, breaker=BREAKER)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), 0.2)

    return loop


async def transitions(database_url: str, node_ids: Iterable[str]) -> list[tuple[str, str]]:
    rows = await db_fetch(
        database_url,
        "SELECT details->>'previous' AS previous, details->>'current' AS current "
        "FROM audit_log WHERE action = 'node.liveness.changed' AND target_id = ANY($1) "
        "ORDER BY id",
        list(node_ids),
    )
    return [(r["previous"], r["current"]) for r in rows]


async def recorded(database_url: str, node_ids: Iterable[str]) -> dict[str, str]:
    rows = await db_fetch(
        database_url,
        "SELECT id::text, liveness FROM nodes WHERE id::text = ANY($1)",
        list(node_ids),
    )
    return {r["id"]: r["liveness"] for r in rows}


async def events(database_url: str, event_type: str) -> list[dict[str, Any]]:
    rows = await db_fetch(
        database_url,
        "SELECT envelope::text AS envelope FROM outbox WHERE envelope->>'type' = $1 "
        "ORDER BY position",
        event_type,
    )
    return [json.loads(r["envelope"]) for r in rows]


async def until(check: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = await check()
        if found:
            return found
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout_s}s")


def enroll_fleet(api: RunningApi, count: int) -> list[EnrolledNode]:
    with api.client() as client:
        return [enroll(client, api, hostname=f"fleet-{i}") for i in range(count)]


async def all_in(database_url: str, nodes: list[EnrolledNode], state: str) -> bool:
    states = await recorded(database_url, [n.node_id for n in nodes])
    return set(states.values()) == {state}


async def all_online(database_url: str, nodes: list[EnrolledNode]) -> bool:
    return await all_in(database_url, nodes, "online")


# --------------------------------------------------------------------------- restart grace


@pytest.mark.slow
@pytest.mark.parametrize("workers_during_outage", [True, False], ids=["workers-up", "all-down"])
async def test_a_control_plane_outage_marks_no_node_offline(
    api_factory: ApiFactory,
    sessions: async_sessionmaker[AsyncSession],
    database_url: str,
    workers_during_outage: bool,
) -> None:
    """Every API down for 2x the offline threshold (with or without the sweepers), then
    the agents come back: zero false offline (or stale) transitions. A node that really
    died during the outage still goes offline once the grace has passed."""
    api = start_api(api_factory)
    nodes = enroll_fleet(api, 6)
    dead = nodes[-1]
    fleet = Fleet(api, nodes)
    paused = asyncio.Event()
    async with running(fleet.run, sweeper(sessions, paused)):
        await until(lambda: all_online(database_url, nodes), 10, "all online")
        first_beats = [("offline", "online")] * len(nodes)
        # The audit rows are the workers' (after the request answered): wait for them.
        await asyncio.to_thread(api.settle)
        assert await transitions(database_url, [n.node_id for n in nodes]) == first_beats

        # Every API process is gone; stopped from a thread, so that the agents and the
        # sweeper carry on meanwhile, as they would.
        await asyncio.to_thread(api.stop)
        if not workers_during_outage:
            paused.set()
        fleet.stop([dead])  # one node dies during the outage
        # Time must pass to show that nothing happens in it: not a wait for a condition.
        await asyncio.sleep(2 * THRESHOLDS.offline_after_s)
        await asyncio.to_thread(api.settle)
        during = await transitions(database_url, [n.node_id for n in nodes])
        assert during == first_beats, "nothing may be recorded while no API hears the nodes"

        fleet.api = await asyncio.to_thread(start_api, api_factory)
        paused.clear()
        # Longer than the grace plus the offline threshold: the dead node goes offline.
        await until(
            lambda: _is(database_url, dead, "offline"),
            THRESHOLDS.restart_grace_s + THRESHOLDS.offline_after_s + 3,
            "the dead node offline",
        )
    alive = [n.node_id for n in nodes if n is not dead]
    await asyncio.to_thread(fleet.api.settle)
    assert await transitions(database_url, alive) == [("offline", "online")] * len(alive)
    assert set((await recorded(database_url, alive)).values()) == {"online"}
    with fleet.api.client() as client:
        presence = client.get(FLEET, headers=fleet.api.admin_headers).json()["api_presence"]
    assert presence["resumed_at"] > presence["down_since"]  # the outage was recorded


@pytest.mark.slow
async def test_a_return_storm_is_answered_from_the_warm_cache_with_no_false_transition(
    api_factory: ApiFactory, sessions: async_sessionmaker[AsyncSession], database_url: str
) -> None:
    """The return storm at a small scale: a fleet heartbeating, every API down for 2x
    the offline threshold, then one back. Every node is heard again within a few
    periods, most first heartbeats are answered from the warm node cache (not one
    transaction per node), and no node is ever recorded stale or offline."""
    api = start_api(api_factory)
    # As many as an in-process API answers at this period on a loaded 2-core box with
    # a margin: overload would make genuine stale transitions, not false ones.
    nodes = enroll_fleet(api, 40)
    ids = [n.node_id for n in nodes]
    fleet = Fleet(api, nodes, period_s=0.5)
    paused = asyncio.Event()
    async with running(fleet.run, sweeper(sessions, paused)):
        await until(lambda: all_online(database_url, nodes), 20, "all online")
        await asyncio.to_thread(api.stop)
        # Time must pass to show that nothing happens in it: not a wait for a condition.
        await asyncio.sleep(2 * THRESHOLDS.offline_after_s)
        [row] = await db_fetch(database_url, "SELECT statement_timestamp() AS now")
        fleet.api = await asyncio.to_thread(start_api, api_factory)

        async def heard_again() -> bool:
            [heard] = await db_fetch(
                database_url,
                "SELECT count(*) AS n FROM nodes WHERE id::text = ANY($1)"
                " AND last_heartbeat_at > $2",
                ids,
                row["now"],
            )
            return bool(heard["n"] == len(nodes))

        await until(heard_again, 15, "every node heard by the restarted API")
        with fleet.api.client() as client:
            metrics = client.get("/metrics").text
    await asyncio.to_thread(fleet.api.settle)
    assert await transitions(database_url, ids) == [("offline", "online")] * len(nodes)
    assert set((await recorded(database_url, ids)).values()) == {"online"}
    counted = {
        path: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        for path in ("routine", "transactional")
        if line.startswith(f'modelforge_heartbeats_total{{path="{path}"}}')
    }
    assert counted.get("routine", 0) >= len(nodes)
    assert counted.get("transactional", 0) < len(nodes) / 2, counted


async def _is(database_url: str, node: EnrolledNode, state: str) -> bool:
    return (await recorded(database_url, [node.node_id]))[node.node_id] == state


# --------------------------------------------------------------------------- partitions


def fleet_safety(api: RunningApi) -> dict[str, Any]:
    with api.client() as client:
        body: dict[str, Any] = client.get(FLEET, headers=api.admin_headers).json()
        ready: dict[str, Any] = client.get("/readyz").json()
    assert ready["partition_hold"] is body["partition_hold"]
    return body


@pytest.mark.slow
async def test_sixty_percent_silent_holds_offline_five_percent_does_not(
    api_factory: ApiFactory, sessions: async_sessionmaker[AsyncSession], database_url: str
) -> None:
    api = start_api(api_factory)
    nodes = enroll_fleet(api, 20)
    fleet = Fleet(api, nodes)
    paused = asyncio.Event()
    async with running(fleet.run, sweeper(sessions, paused)):
        await until(lambda: all_online(database_url, nodes), 15, "all online")

        # 60 % at once: a partition, not a mass failure.
        cut = nodes[:12]
        fleet.stop(cut)
        opened = await until(
            lambda: events(database_url, "io.modelforge.fleet.partition_suspected.v1"),
            10,
            "partition suspected",
        )
        assert len(opened) == 1
        assert opened[0]["data"]["silent_nodes"] >= 7 and opened[0]["data"]["watched_nodes"] == 20
        await until(lambda: all_in(database_url, cut, "stale"), 10, "the silent nodes stale")
        # Time must pass to show that the hold keeps them from going offline: not a wait
        # for a condition.
        await asyncio.sleep(2 * THRESHOLDS.offline_after_s)
        states = await recorded(database_url, [n.node_id for n in cut])
        assert set(states.values()) == {"stale"}, states  # silent, visible, held
        safety = fleet_safety(api)
        assert safety["partition_hold"] is True
        assert safety["open_incident"]["kind"] == "partition_suspected"

        # The partition heals: the nodes are back, the incident resolves by itself.
        fleet.resume()
        await until(lambda: all_online(database_url, nodes), 10, "all back online")
        await until(
            lambda: events(database_url, "io.modelforge.fleet.partition_resolved.v1"),
            10,
            "partition resolved",
        )
        assert fleet_safety(api)["partition_hold"] is False

        # 5 %: an ordinary failure; it goes offline on the usual thresholds.
        lost = nodes[:1]
        fleet.stop(lost)
        await until(lambda: _is(database_url, lost[0], "offline"), 6, "5 % offline")
        assert len(await events(database_url, "io.modelforge.fleet.partition_suspected.v1")) == 1
    never_offline = [n.node_id for n in nodes[1:]]
    assert ("stale", "offline") not in await transitions(database_url, never_offline)


@pytest.mark.slow
async def test_an_acknowledged_partition_lets_the_silent_nodes_go_offline(
    api_factory: ApiFactory, sessions: async_sessionmaker[AsyncSession], database_url: str
) -> None:
    api = start_api(api_factory)
    nodes = enroll_fleet(api, 10)
    fleet = Fleet(api, nodes)
    paused = asyncio.Event()
    async with running(fleet.run, sweeper(sessions, paused)):
        await until(lambda: all_online(database_url, nodes), 15, "all online")
        cut = nodes[:5]
        fleet.stop(cut)
        await until(lambda: _hold(api), 10, "the hold")
        incident = fleet_safety(api)["open_incident"]
        with api.client() as client:
            path = f"{FLEET}/incidents/{incident['id']}/acknowledge"
            refused = client.post(path, json={}, headers=api.admin_headers)
            assert refused.status_code == 422
            response = client.post(
                path, json={"reason": "rack 7 lost power"}, headers=api.admin_headers
            )
            assert response.status_code == 200, response.text
            assert response.json()["acknowledged_reason"] == "rack 7 lost power"
            again = client.post(path, json={"reason": "twice"}, headers=api.admin_headers)
            assert again.json()["acknowledged_reason"] == "rack 7 lost power"  # idempotent
        for node in cut:
            await until(lambda node=node: _is(database_url, node, "offline"), 6, "offline")
        # Offline nodes leave the watched set: the incident resolves by itself.
        await until(
            lambda: events(database_url, "io.modelforge.fleet.partition_resolved.v1"),
            10,
            "resolved",
        )
        resolved = await events(database_url, "io.modelforge.fleet.partition_resolved.v1")
        assert resolved[0]["data"]["acknowledged"] is True
        acknowledged = await events(database_url, "io.modelforge.fleet.partition_acknowledged.v1")
        assert len(acknowledged) == 1
        with api.client() as client:
            late = client.post(path, json={"reason": "late"}, headers=api.admin_headers)
            assert late.status_code == 409, late.text
            unknown = client.post(
                f"{FLEET}/incidents/00000000-0000-0000-0000-000000000000/acknowledge",
                json={"reason": "x"},
                headers=api.admin_headers,
            )
            assert unknown.status_code == 404


async def _hold(api: RunningApi) -> bool:
    return bool(fleet_safety(api)["partition_hold"])


async def test_concurrent_sweeps_open_one_incident(
    api_factory: ApiFactory, sessions: async_sessionmaker[AsyncSession], database_url: str
) -> None:
    """Eight sweepers evaluate the same tripped fleet at once: one incident, one event."""
    api = start_api(api_factory)
    nodes = enroll_fleet(api, 10)
    with api.client() as client:
        for node in nodes:
            client.post(HEARTBEAT, json=heartbeat_body(node.node_id), headers=node.headers)
    for _ in range(5):
        await sweep(sessions, THRESHOLDS, breaker=BREAKER)
    assert set((await recorded(database_url, [n.node_id for n in nodes])).values()) == {"online"}
    # Everyone goes silent; keep the API present so the sweeps are not held for that.
    # Silence is time passing (past the stale threshold): nothing to wait for but it.
    await asyncio.sleep(THRESHOLDS.stale_after_s + 0.2)
    await asyncio.gather(*(sweep(sessions, THRESHOLDS, breaker=BREAKER) for _ in range(8)))
    rows = await db_fetch(database_url, "SELECT count(*) AS n FROM fleet_incidents")
    assert rows[0]["n"] == 1
    assert len(await events(database_url, "io.modelforge.fleet.partition_suspected.v1")) == 1


@pytest.mark.slow
async def test_lease_expiry_holds_while_a_partition_is_suspected(
    api_factory: ApiFactory, sessions: async_sessionmaker[AsyncSession], database_url: str
) -> None:
    """A suspected partition holds lease expiry as it holds offline transitions: the
    cut-off holder's lease is long past due, yet its job stays leased until an operator
    acknowledges the incident (or it resolves)."""
    api = api_on_thresholds(api_factory, THRESHOLDS, job_lease_s=0.5)
    policy = LeasePolicy(lease_s=0.5, retry_base_s=0.0)
    nodes = enroll_fleet(api, 10)
    holder = nodes[0]
    fleet = Fleet(api, nodes)
    paused = asyncio.Event()
    async with running(fleet.run, sweeper(sessions, paused)):
        await until(lambda: all_online(database_url, nodes), 15, "all online")
        with api.client() as client:
            offer_roots(client, holder, [ROOT])
            job_id = created(client, api, holder)
            claimed(client, holder)
        fleet.stop(nodes[:5])
        await until(lambda: _hold(api), 10, "the hold")
        await asyncio.sleep(1.0)  # twice the lease: due, were it not for the hold
        assert await expire(sessions, policy) == 0
        with api.client() as client:
            assert get_job(client, api, job_id)["state"] == "leased"
            incident = fleet_safety(api)["open_incident"]
            acknowledged = client.post(
                f"{FLEET}/incidents/{incident['id']}/acknowledge",
                json={"reason": "the rack is really gone"},
                headers=api.admin_headers,
            )
            assert acknowledged.status_code == 200, acknowledged.text
        assert await expire(sessions, policy) == 1
        with api.client() as client:
            view = get_job(client, api, job_id)
        assert view["state"] == "queued" and view["failure"]["code"] == "lease_expired"
