"""The service reconciler (store/services/reconcile.py, workers/service_reconcile.py)
against the real API and PostgreSQL, the test speaking for each node's agent and
runtime worker over the protocol: replicas spread over nodes, acquired then loaded
where the file is missing, moved with a backoff when a load fails, healed when a node
goes offline and the surplus drained when it returns, scaled down and deleted by
draining, rolled out one at a time (and stopped by a failed new replica), autoscaled
with a cooldown, and several sweeps at once never placing more than desired."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from schemas.services import Autoscale, UpdateStrategy
from store.deployments.tables import Deployment
from store.models import Job, OutboxEvent
from store.services import rules
from store.services.reconcile import ServicePolicy, reconcile_one
from store.services.replicas import back_off, forgive
from store.services.snapshot import FleetCache
from store.services.tables import Service, ServiceReplica
from tests.api_server import ApiFactory, RunningApi
from tests.deployment_flows import RECONCILE_POLICY
from tests.measurement_flows import until
from tests.service_flows import (
    POLICY,
    ServiceNode,
    another_profile,
    apply_rule,
    change,
    create_service,
    events,
    fleet,
    fleet_serving,
    in_thread,
    liveness,
    load_all,
    made_ready,
    nodes_of,
    on,
    phases,
    ready_count,
    replicas,
    rollout_rounds,
    service_node,
    service_row,
    step,
    sweep_keeping_alive,
    template,
)

# The fixture `api` these tests run on.
from tests.service_flows import ready_api as ready_api
from tests.worker_processes import Workers
from workers.deployments import reconcile as reconcile_deployments
from workers.service_reconcile import reconcile as reconcile_services


async def ready_on_one_of_two(
    api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> tuple[list[ServiceNode], uuid.UUID, ServiceReplica, ServiceNode, ServiceNode]:
    """Two nodes and a service of one replica made ready on one of them: the nodes, the
    service, the replica, its node and the other node."""
    nodes, _, service_id = await fleet_serving(sessions, api, 2)
    [replica] = await made_ready(sessions, api, nodes, service_id)
    holder = on(nodes, replica.node_id)
    other = next(node for node in nodes if node is not holder)
    return nodes, service_id, replica, holder, other


async def rollout_stopped_by_a_failed_load(
    api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> tuple[list[ServiceNode], dict[str, Any], uuid.UUID, ServiceReplica, ServiceNode]:
    """Three nodes, a service of one replica made ready, then rolled out to another
    profile: the new replica's node fails its load for good, and a sweep sees it. The
    nodes, the first profile, the service, the old replica and the failing node."""
    nodes, profile, service_id = await fleet_serving(sessions, api, 3)
    broken = another_profile(api, name="broken")
    [old] = await made_ready(sessions, api, nodes, service_id)
    await apply_rule(sessions, rules.rollout, service_id, template(broken["id"]))
    await step(sessions)
    [new] = [row for row in await replicas(sessions, service_id) if row.generation == 2]
    failing = on(nodes, new.node_id)
    await in_thread(api, failing.fail_load)
    await step(sessions)
    return nodes, profile, service_id, old, failing


async def test_replicas_spread_over_nodes_and_become_ready(
    api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> None:
    nodes, _, service_id = await fleet_serving(sessions, api, 3, replicas=2)
    done = await step(sessions)
    placed = await replicas(sessions, service_id)
    assert len(placed) == 2 and phases(placed) == ["loading", "loading"], done
    # Spread: one replica per node (max_per_node 1), each on a distinct device.
    assert len(nodes_of(placed)) == 2
    receipt = (await service_row(sessions, service_id)).last_receipt
    assert receipt is not None and receipt["outcome"] == "placed" and receipt["holds_artifact"]
    chosen = [node for node in nodes if node.node_id in nodes_of(placed)]
    await load_all(api, chosen)
    await step(sessions)
    ready = await replicas(sessions, service_id)
    assert phases(ready) == ["ready", "ready"]
    # Nothing more to do: a further sweep places nothing and changes nothing.
    assert await step(sessions) == {}
    assert len(await replicas(sessions, service_id)) == 2


async def test_a_node_lacking_the_file_acquires_it_then_loads(
    api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> None:
    [node], _, service_id = await fleet_serving(sessions, api, 1, holds=False)
    await step(sessions)
    [replica] = await replicas(sessions, service_id)
    assert replica.phase == "acquiring" and replica.artifact_job_id is not None
    assert replica.deployment_id is None and replica.receipt is not None
    assert replica.receipt["holds_artifact"] is False
    # Nothing moves before the job does.
    await step(sessions)
    assert (await replicas(sessions, service_id))[0].phase == "acquiring"
    await in_thread(api, node.acquire)
    await step(sessions)
    [replica] = await replicas(sessions, service_id)
    assert replica.phase == "loading" and replica.deployment_id is not None
    await in_thread(api, node.load)
    await step(sessions)
    assert phases(await replicas(sessions, service_id)) == ["ready"]
    changed = await events(sessions, "service.replica_changed")
    assert [e["data"]["action"] for e in changed] == ["acquiring", "loading", "ready"]


async def test_a_failed_acquisition_moves_the_replica_with_a_backoff(
    api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> None:
    [bare], _, service_id = await fleet_serving(sessions, api, 1, holds=False)
    await step(sessions)
    [replica] = await replicas(sessions, service_id)
    assert replica.phase == "acquiring"
    await in_thread(api, bare.fail_acquire)
    # The only node is backed off: nothing placed, the receipt says why, once.
    for _ in range(3):
        await step(sessions)
    assert await replicas(sessions, service_id) == []
    [ended] = await replicas(sessions, service_id, ended=True)
    assert ended.ended_reason == "failed" and ended.failure_code == "checksum_mismatch"
    service = await service_row(sessions, service_id)
    assert service.backoff[str(bare.node_id)]["failures"] == 1
    assert service.last_receipt is not None and service.last_receipt["outcome"] == "unplaceable"
    assert "1 backoff" in service.last_receipt["message"]
    unplaceable = await events(sessions, "service.unplaceable")
    assert len(unplaceable) == 1 and unplaceable[0]["data"]["receipt"]["rejected"] == {"backoff": 1}


async def test_a_failed_load_moves_the_replica_elsewhere_with_a_backoff(
    api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> None:
    nodes, _, service_id = await fleet_serving(sessions, api, 2)
    await step(sessions)
    [first] = await replicas(sessions, service_id)
    failing = on(nodes, first.node_id)
    await in_thread(api, failing.fail_load)
    # One step: the failed replica ends, its node is backed off, a replacement goes to
    # the other node.
    await step(sessions)
    [second] = await replicas(sessions, service_id)
    assert second.node_id != first.node_id and second.phase == "loading"
    ended = [r for r in await replicas(sessions, service_id, ended=True) if r.id == first.id]
    assert ended[0].phase == "ended" and ended[0].ended_reason == "failed"
    assert ended[0].failure_code == "out_of_memory"
    service = await service_row(sessions, service_id)
    entry = service.backoff[str(first.node_id)]
    assert entry["failures"] == 1
    await in_thread(api, on(nodes, second.node_id).load)
    await step(sessions)
    assert phases(await replicas(sessions, service_id)) == ["ready"]


async def test_a_lost_replica_is_replaced_and_drained_when_its_node_returns(
    api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> None:
    nodes, service_id, lost, lost_node, other = await ready_on_one_of_two(api, sessions)
    assert phases(await replicas(sessions, service_id)) == ["ready"]

    # The node goes silent: offline, its deployment unavailable, then (past the heal
    # grace) a replacement on the other node.
    async def replaced() -> list[ServiceReplica]:
        await sweep_keeping_alive(sessions, api, [other])
        rows = await replicas(sessions, service_id)
        return rows if len(rows) == 2 else []

    rows = await until(replaced, "a replacement placed")
    by_id = {row.id: row for row in rows}
    assert by_id[lost.id].phase == "unavailable"
    [replacement] = [row for row in rows if row.id != lost.id]
    assert replacement.node_id == other.node_id
    await in_thread(api, other.load)
    await sweep_keeping_alive(sessions, api, [other])

    # The node returns and reports its deployment loaded: ready again, a surplus now,
    # drained (never cut), then ended once the node unloaded it.
    await in_thread(api, lost_node.beat)
    await in_thread(api, lost_node.report)

    async def drained() -> bool:
        await sweep_keeping_alive(sessions, api, nodes)
        rows = {row.id: row for row in await replicas(sessions, service_id)}
        return lost.id in rows and rows[lost.id].phase == "draining"

    await until(drained, "the returning replica draining")
    assert (await replicas(sessions, service_id))[-1].phase == "ready"
    await in_thread(api, lost_node.drain)
    await sweep_keeping_alive(sessions, api, nodes)
    [kept] = await replicas(sessions, service_id)
    assert kept.id == replacement.id and kept.phase == "ready"
    ended = [r for r in await replicas(sessions, service_id, ended=True) if r.id == lost.id]
    assert ended[0].phase == "ended" and ended[0].ended_reason == "surplus"


async def test_no_healing_while_the_partition_breaker_holds(
    api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> None:
    _, service_id, lost, _, other = await ready_on_one_of_two(api, sessions)

    async def unavailable() -> bool:
        await in_thread(api, other.beat)
        await liveness(sessions)
        await reconcile_deployments(sessions, RECONCILE_POLICY)
        async with sessions() as session, session.begin():
            await reconcile_one(
                session, service_id, POLICY, hold=True, actor="test", cache=FleetCache()
            )
        rows = await replicas(sessions, service_id)
        return rows[0].phase == "unavailable"

    await until(unavailable, "the replica unavailable")
    await asyncio.sleep(POLICY.heal_grace_s + 0.2)  # past the grace on purpose
    async with sessions() as session, session.begin():
        await reconcile_one(
            session, service_id, POLICY, hold=True, actor="test", cache=FleetCache()
        )
    assert [row.id for row in await replicas(sessions, service_id)] == [lost.id]


async def test_scale_down_drains_the_surplus(
    api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> None:
    nodes, _, service_id = await fleet_serving(sessions, api, 2, replicas=2)
    await made_ready(sessions, api, nodes, service_id)
    before = await replicas(sessions, service_id)
    assert phases(before) == ["ready", "ready"]
    await apply_rule(sessions, rules.scale, service_id, 1)
    await step(sessions)
    rows = await replicas(sessions, service_id)
    assert phases(rows) == ["draining", "ready"]
    [draining] = [row for row in rows if row.phase == "draining"]
    assert draining.ended_reason == "surplus"
    # Another sweep drains nothing more: the one left is what is desired.
    await step(sessions)
    assert phases(await replicas(sessions, service_id)) == ["draining", "ready"]
    drained = await in_thread(api, on(nodes, draining.node_id).drain)
    assert drained == str(draining.deployment_id)
    await step(sessions)
    assert phases(await replicas(sessions, service_id)) == ["ready"]


async def test_delete_drains_every_replica_then_the_service_is_deleted(
    api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> None:
    nodes, _, service_id = await fleet_serving(sessions, api, 2, replicas=2)
    await made_ready(sessions, api, nodes, service_id)
    await apply_rule(sessions, rules.delete, service_id)
    await step(sessions)
    assert phases(await replicas(sessions, service_id)) == ["draining", "draining"]
    assert (await service_row(sessions, service_id)).state == "deleting"
    for node in nodes:
        await in_thread(api, node.drain)
    await step(sessions)
    assert await replicas(sessions, service_id) == []
    assert (await service_row(sessions, service_id)).state == "deleted"
    actions = [e["data"]["action"] for e in await events(sessions, "service.changed")]
    assert actions == ["deleting", "deleted"]
    # A deleted service is not swept again.
    assert await step(sessions) == {}


async def test_a_rollout_replaces_one_replica_at_a_time(
    api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> None:
    nodes, _, service_id = await fleet_serving(sessions, api, 3, replicas=2)
    other = another_profile(api, name="roomier", ctx_size=1024)
    old = await made_ready(sessions, api, nodes, service_id)
    await apply_rule(sessions, rules.rollout, service_id, template(other["id"]))
    async for rows in rollout_rounds(sessions, service_id, most=6):
        # Never fewer than desired ready (max_unavailable 0), never more than one
        # extra (max_surge 1) counting what does not drain.
        assert ready_count(rows) >= 2, phases(rows)
        assert sum(1 for row in rows if row.phase != "draining") <= 3, phases(rows)
        for row in rows:
            node = on(nodes, row.node_id)
            if row.phase == "loading" and row.generation == 2:
                await in_thread(api, node.load)
            elif row.phase == "draining":
                await in_thread(api, node.drain)
        await step(sessions)
        rows = await replicas(sessions, service_id)
        assert ready_count(rows) >= 2, phases(rows)
    # Complete once every counted replica is current and ready; the last old one may
    # still be draining its streams.
    for row in await replicas(sessions, service_id):
        if row.phase == "draining":
            await in_thread(api, on(nodes, row.node_id).drain)
    await step(sessions)
    rows = await replicas(sessions, service_id)
    assert phases(rows) == ["ready", "ready"] and {row.generation for row in rows} == {2}
    ended = [
        row for row in await replicas(sessions, service_id, ended=True) if row.phase == "ended"
    ]
    assert sorted(row.id for row in ended) == sorted(row.id for row in old)
    assert all(row.ended_reason == "replaced" for row in ended)
    actions = [e["data"]["action"] for e in await events(sessions, "service.changed")]
    assert actions == ["rollout", "rollout_complete"]


async def test_a_failed_new_replica_stops_the_rollout_and_the_old_one_keeps_serving(
    api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> None:
    _, _, service_id, old, _ = await rollout_stopped_by_a_failed_load(api, sessions)
    service = await service_row(sessions, service_id)
    assert service.rollout_state == "stopped"
    assert service.rollout_reason is not None and "out_of_memory" in service.rollout_reason
    # The old replica keeps serving, and no new one is placed while stopped.
    for _ in range(2):
        await step(sessions)
    [kept] = await replicas(sessions, service_id)
    assert kept.id == old.id and kept.phase == "ready"
    actions = [e["data"]["action"] for e in await events(sessions, "service.changed")]
    assert actions == ["rollout", "rollout_stopped"]
    # An undo relabels the old replica as the current generation: complete at once.
    await apply_rule(sessions, rules.undo, service_id)
    await step(sessions)
    assert (await service_row(sessions, service_id)).rollout_state == "complete"
    assert [row.id for row in await replicas(sessions, service_id)] == [old.id]


async def test_an_unplaceable_replica_is_one_event_until_the_reason_changes(
    api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> None:
    _, _, service_id = await fleet_serving(sessions, api, 1, replicas=2)
    for _ in range(4):
        await step(sessions)
    assert len(await replicas(sessions, service_id)) == 1
    [event] = await events(sessions, "service.unplaceable")
    receipt = event["data"]["receipt"]
    assert receipt["outcome"] == "unplaceable" and receipt["rejected"] == {"device_busy": 1}
    assert event["data"]["reason"] == receipt["message"]
    assert (await service_row(sessions, service_id)).last_receipt == receipt
    # Another node: placed once the scheduler sees it (its fleet snapshot is a few
    # seconds old at most, store/services/snapshot.py); the receipt moves on.
    with api.client() as client:
        service_node(client, api, "host-1")

    async def placed() -> bool:
        await step(sessions)
        return len(await replicas(sessions, service_id)) == 2

    await until(placed, "the second replica placed on the new node")
    assert len(await events(sessions, "service.unplaceable")) == 1
    last = (await service_row(sessions, service_id)).last_receipt
    assert last is not None and last["outcome"] == "placed"


async def test_autoscale_on_queue_depth_with_hysteresis_and_cooldown(
    api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> None:
    bounds = Autoscale(min_replicas=1, max_replicas=3, target_queue_per_replica=2.0,
                       cooldown_s=3600)  # fmt: skip
    nodes, _, service_id = await fleet_serving(sessions, api, 3, autoscale=bounds)
    [first] = await made_ready(sessions, api, nodes, service_id)
    busy = on(nodes, first.node_id)
    deployment_id = str(first.deployment_id)

    async def queue(depth: int) -> None:
        busy.loaded[deployment_id] = depth
        await in_thread(api, busy.report)

    # 5 in flight on one ready replica, target 2: up to ceil(5 / 2) = 3.
    await queue(5)
    await step(sessions)
    service = await service_row(sessions, service_id)
    assert service.replicas == 3 and service.scaled_at is not None
    [scaled] = await events(sessions, "service.changed")
    assert scaled["data"]["action"] == "autoscaled" and "queue 5" in scaled["data"]["reason"]
    assert len(await replicas(sessions, service_id)) == 3
    # Idle now, but within the cooldown: no change.
    await queue(0)
    await step(sessions)
    assert (await service_row(sessions, service_id)).replicas == 3
    # Past the cooldown, 1 in flight per ready replica: above half the target
    # (hysteresis), so no change either.
    await change(sessions, service_id, scaled_at=service.scaled_at - timedelta(hours=2))
    await queue(1)
    await step(sessions)
    assert (await service_row(sessions, service_id)).replicas == 3
    # Idle: down to the minimum, the surplus drained.
    await queue(0)
    await step(sessions)
    assert (await service_row(sessions, service_id)).replicas == 1
    rows = await replicas(sessions, service_id)
    assert phases(rows).count("draining") == 2 and ready_count(rows) == 1
    actions = [e["data"]["action"] for e in await events(sessions, "service.changed")]
    assert actions == ["autoscaled", "autoscaled"]


async def test_concurrent_sweeps_never_place_more_than_desired_nor_two_on_a_device(
    api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> None:
    _, profile = fleet(api, 5)
    first = await create_service(sessions, profile["id"], name="first", replicas=3)
    second = await create_service(sessions, profile["id"], name="second", replicas=3)
    # Eight workers sweep at once, twice over: the two services want six devices and
    # five exist.
    rounds = [
        await asyncio.gather(
            *(reconcile_services(sessions, POLICY, FleetCache()) for _ in range(8))
        )
        for _ in range(2)
    ]
    # The first round places; a placement whose node another step holds gives up for
    # that round (store/locks.py), so the second may or may not have work left.
    assert any(rounds[0])
    rows = await replicas(sessions, first) + await replicas(sessions, second)
    assert len(rows) == 5
    assert len({(row.node_id, row.device_id) for row in rows}) == 5
    assert len(await replicas(sessions, first)) <= 3
    assert len(await replicas(sessions, second)) <= 3
    async with sessions() as session:
        placed = await session.execute(
            select(func.count())
            .select_from(OutboxEvent)
            .where(OutboxEvent.envelope["action"].astext == "service.replica_changed")
        )
    # Every placement is one event: none was made and then thrown away twice over.
    assert placed.scalar_one() == 5


async def test_worker_processes_run_the_service_sweep(
    api_factory: ApiFactory, workers: Workers, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """The periodic actor (workers/actors.py: service_reconcile) in two real worker
    processes at once: the service gets its replicas, exactly as many as desired."""
    workers.env["MODELFORGE_SERVICE_SWEEP_PERIOD_S"] = "0.3"
    api = workers.api(api_factory)
    nodes, profile = fleet(api, 3)
    workers.start(2)
    service_id = await create_service(sessions, profile["id"], replicas=2)

    def beat_all(client: Any) -> None:
        for node in nodes:
            node.beat(client)

    async def placed() -> list[ServiceReplica]:
        await in_thread(api, beat_all)  # the nodes stay online on the workers' thresholds
        rows = await replicas(sessions, service_id)
        return rows if len(rows) == 2 else []

    rows = await until(placed, "two replicas placed by the workers", timeout_s=60)
    assert len(nodes_of(rows)) == 2
    # Later sweeps of both workers leave it there.
    await in_thread(api, beat_all)
    await asyncio.sleep(1.0)  # a window for what must not happen, not a wait
    assert len(await replicas(sessions, service_id, ended=True)) == 2


async def test_a_rollout_on_a_full_fleet_makes_room_within_max_unavailable(
    api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """Every node holds a replica: with max_unavailable 1 an old replica drains first
    (one ready left), its device takes a new one, and so on; never below one ready."""
    strategy = UpdateStrategy(max_surge=1, max_unavailable=1, drain_deadline_s=5)
    nodes, _, service_id = await fleet_serving(sessions, api, 2, replicas=2, strategy=strategy)
    other = another_profile(api, name="roomier", ctx_size=1024)
    await made_ready(sessions, api, nodes, service_id)
    await apply_rule(sessions, rules.rollout, service_id, template(other["id"]))
    async for rows in rollout_rounds(sessions, service_id, most=8):
        assert ready_count(rows) >= 1, phases(rows)
        assert sum(1 for row in rows if row.phase == "draining") <= 1, phases(rows)
        for row in rows:
            if row.phase == "draining":
                await in_thread(api, on(nodes, row.node_id).drain)
            elif row.phase == "loading":
                await in_thread(api, on(nodes, row.node_id).load)
    rows = await replicas(sessions, service_id)
    assert phases(rows) == ["ready", "ready"] and {row.generation for row in rows} == {2}


async def test_an_acquisition_on_a_node_gone_offline_is_given_up_after_the_grace(
    api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> None:
    [bare], _, service_id = await fleet_serving(sessions, api, 1, holds=False)
    await step(sessions)
    [acquiring] = await replicas(sessions, service_id)
    assert acquiring.phase == "acquiring" and acquiring.node_id == bare.node_id
    with api.client() as client:
        holder = service_node(client, api, "holder")

    async def moved() -> list[ServiceReplica]:
        await sweep_keeping_alive(sessions, api, [holder])
        found = await replicas(sessions, service_id)
        return found if [row.node_id for row in found] == [holder.node_id] else []

    [replacement] = await until(moved, "the replica moved to the node online")
    assert replacement.phase == "loading"
    ended = [r for r in await replicas(sessions, service_id, ended=True) if r.id == acquiring.id]
    assert ended[0].ended_reason == "node_offline"
    async with sessions() as session:
        job = await session.get(Job, acquiring.artifact_job_id)
    assert job is not None and job.state == "cancelled"
    service = await service_row(sessions, service_id)
    assert str(bare.node_id) in service.backoff


def test_the_backoff_grows_per_node_is_capped_and_forgotten() -> None:
    policy = ServicePolicy(backoff_base_s=10, backoff_max_s=35)
    service = Service(backoff={})
    now = datetime(2026, 1, 1, tzinfo=UTC)
    node, other = uuid.uuid4(), uuid.uuid4()
    untils = []
    for _ in range(4):
        back_off(service, node, now, policy)
        untils.append(datetime.fromisoformat(service.backoff[str(node)]["until"]) - now)
    # 10 s, 20 s, then the cap (35 s), per node.
    assert untils == [timedelta(seconds=s) for s in (10, 20, 35, 35)]
    assert service.backoff[str(node)]["failures"] == 4
    back_off(service, other, now, policy)
    assert service.backoff[str(other)]["failures"] == 1
    # Long past its time (more than the cap): forgotten when the map is next written.
    back_off(service, other, now + timedelta(seconds=71), policy)
    assert str(node) not in service.backoff
    # A replica ready on a node forgives it.
    forgive(service, other)
    assert service.backoff == {}


async def test_a_service_whose_step_fails_does_not_stop_the_sweep(
    api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> None:
    _, profile = fleet(api, 1)
    broken = await create_service(sessions, profile["id"], name="broken")
    # First in the sweep's order, with a template no model accepts.
    first = uuid.UUID(int=1)
    await change(sessions, broken, id=first, template={"artifact": "not one"})
    good = await create_service(sessions, profile["id"], name="good")
    done = await step(sessions)
    assert str(first) not in done
    assert len(await replicas(sessions, good)) == 1
    assert await replicas(sessions, first) == []


async def test_a_stopped_rollout_replaces_a_lost_old_replica_with_the_old_template(
    api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> None:
    nodes, profile, service_id, old, failing = await rollout_stopped_by_a_failed_load(api, sessions)
    lost_node = on(nodes, old.node_id)
    assert (await service_row(sessions, service_id)).rollout_state == "stopped"
    spare = next(node for node in nodes if node not in (lost_node, failing))

    # The old replica's node goes silent: past the grace, a replica of the previous
    # template (generation 1) takes its place on the spare node, not the new one.
    async def healed() -> list[ServiceReplica]:
        await sweep_keeping_alive(sessions, api, [failing, spare])
        rows = [row for row in await replicas(sessions, service_id) if row.id != old.id]
        return rows

    [replacement] = await until(healed, "a replacement of the old template")
    assert replacement.generation == 1 and replacement.node_id == spare.node_id
    deployment_id = await in_thread(api, spare.load)
    async with sessions() as session:
        deployment = await session.get(Deployment, uuid.UUID(deployment_id))
    assert deployment is not None and str(deployment.profile_id) == profile["id"]
    await sweep_keeping_alive(sessions, api, [failing, spare])
    service = await service_row(sessions, service_id)
    assert service.rollout_state == "stopped" and service.generation == 2
    rows = {row.id: row for row in await replicas(sessions, service_id)}
    assert rows[replacement.id].phase == "ready"


async def test_a_load_no_one_claims_goes_elsewhere_after_the_claim_timeout(
    api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """A node online whose runtime worker takes nothing (it died, its agent beats)."""
    policy = replace(POLICY, claim_timeout_s=0.5)
    _, _, service_id = await fleet_serving(sessions, api, 2)
    await step(sessions, policy)
    [stuck] = await replicas(sessions, service_id)
    assert stuck.phase == "loading"

    async def moved() -> list[ServiceReplica]:
        await step(sessions, policy)
        rows = await replicas(sessions, service_id)
        return rows if rows and rows[0].id != stuck.id else []

    [moved_to] = await until(moved, "the replica placed elsewhere", timeout_s=10)
    assert moved_to.node_id != stuck.node_id
    [ended] = [r for r in await replicas(sessions, service_id, ended=True) if r.id == stuck.id]
    assert ended.failure_code == "not_claimed" and ended.ended_reason == "failed"
    async with sessions() as session:
        deployment = await session.get(Deployment, stuck.deployment_id)
    assert deployment is not None and deployment.state == "draining"
    assert str(stuck.node_id) in (await service_row(sessions, service_id)).backoff
