"""A service's replica whose node is lost (review R1, issue 32): decommissioned while a
new replica downloads there, or offline while its replica drains. Neither is the
template's fault nor a reason to wait for the node: the replica ends "node_lost" (no
backoff, not a failed new replica) and the service moves on. Against the real API and
PostgreSQL, the test speaking for each node over the protocol."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from schemas.services import UpdateStrategy
from store import nodes
from store.deployments.tables import Deployment
from store.services import rules
from store.services.reconcile import reconcile_one
from store.services.snapshot import FleetCache
from store.services.tables import ServiceReplica
from tests.admin_helpers import decommission, ok, patch_node
from tests.api_server import RunningApi
from tests.measurement_flows import until
from tests.service_flows import (
    POLICY,
    ServiceNode,
    another_profile,
    apply_rule,
    fleet_serving,
    in_thread,
    liveness,
    made_ready,
    replicas,
    service_node,
    service_row,
    step,
    template,
)

# The fixture `api` these tests run on.
from tests.service_flows import ready_api as ready_api


async def new_replica_acquiring(
    api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> tuple[uuid.UUID, ServiceNode, ServiceReplica]:
    """A service ready on a node that holds the file, then a rollout to another profile
    whose new replica goes to a node joining without it: acquiring there. The service,
    that node, the new replica."""
    [holder], _, service_id = await fleet_serving(sessions, api, 1)
    other = another_profile(api, name="other")
    [_old] = await made_ready(sessions, api, [holder], service_id)
    with api.client() as client:
        bare = service_node(client, api, "bare", holds=False)
    await apply_rule(sessions, rules.rollout, service_id, template(other["id"]))

    async def placed() -> list[Any]:
        await step(sessions)
        return [r for r in await replicas(sessions, service_id) if r.generation == 2]

    [new] = await until(placed, "a replica of the new template placed")
    assert new.node_id == bare.node_id and new.phase == "acquiring", (new.node_id, new.phase)
    return service_id, bare, new


async def assert_lost_not_blamed(
    sessions: async_sessionmaker[AsyncSession],
    service_id: uuid.UUID,
    node: ServiceNode,
    lost_id: uuid.UUID,
) -> None:
    """The rollout goes on, the node is not backed off, the replica ended "node_lost"."""
    service = await service_row(sessions, service_id)
    assert service.rollout_state == "progressing", service.rollout_reason
    assert str(node.node_id) not in (service.backoff or {})
    [lost] = [r for r in await replicas(sessions, service_id, ended=True) if r.id == lost_id]
    assert lost.phase == "ended" and lost.ended_reason == "node_lost", lost.ended_reason


async def test_a_decommission_while_a_new_replica_acquires_does_not_stop_the_rollout(
    api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> None:
    service_id, bare, new = await new_replica_acquiring(api, sessions)

    # The operator decommissions the node mid-download: its job is cancelled.
    with api.client() as client:
        ok(decommission(client, api, str(bare.node_id)))
        spare = service_node(client, api, "spare")

    async def replaced() -> list[Any]:
        await step(sessions)
        return [
            r
            for r in await replicas(sessions, service_id)
            if r.generation == 2 and r.node_id == spare.node_id
        ]

    [replacement] = await until(replaced, "a replacement of the new template placed")
    await assert_lost_not_blamed(sessions, service_id, bare, new.id)
    assert replacement.generation == 2


async def test_a_delete_completes_when_a_draining_replica_s_node_stays_offline(
    api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """A replica draining on a node that is offline but still enabled ends "node_lost"
    past the drain deadline and the heal grace, so the delete completes; its deployment
    stays draining for the node's return (the deployment reconciler unloads it then)."""
    strategy = UpdateStrategy(drain_deadline_s=0.5)
    [gone], _, service_id = await fleet_serving(sessions, api, 1, strategy=strategy)
    [replica] = await made_ready(sessions, api, [gone], service_id)
    await apply_rule(sessions, rules.delete, service_id)
    await step(sessions)
    assert [r.phase for r in await replicas(sessions, service_id)] == ["draining"]

    # The node never answers again (it stays enabled).
    async def deleted() -> bool:
        await liveness(sessions)
        await step(sessions)
        return (await service_row(sessions, service_id)).state == "deleted"

    await until(deleted, "the service deleted with its node offline")
    [ended] = await replicas(sessions, service_id, ended=True)
    assert ended.id == replica.id and ended.ended_reason == "node_lost"
    async with sessions() as session:
        deployment = await session.get(Deployment, replica.deployment_id)
    assert deployment is not None and deployment.state == "draining"


async def test_a_placement_never_waits_on_a_node_lock_another_holds(
    api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """A reconciler step may already hold a node's lock (following a replica there) when
    it places on another node: were it to wait for that node's lock, two steps placing
    on each other's nodes would deadlock. The placement only tries the node's lock; held
    elsewhere, it gives the placement up for this sweep and places on the next one."""
    [only], _, service_id = await fleet_serving(sessions, api, 1)
    async with sessions() as holder, holder.begin():
        await nodes.lock(holder, only.node_id)  # another transaction holds the node

        async def one_step() -> list[str] | None:
            async with sessions() as session, session.begin():
                return await reconcile_one(
                    session, service_id, POLICY, hold=False, actor="t", cache=FleetCache()
                )

        done = await asyncio.wait_for(one_step(), 5.0)
        assert done is not None and not any("placed on" in action for action in done), done
        assert await replicas(sessions, service_id) == []
    done = await one_step()
    assert done is not None and any("placed on" in action for action in done), done
    [placed] = await replicas(sessions, service_id)
    assert placed.node_id == only.node_id


async def test_a_node_disabled_once_the_new_replica_acquired_does_not_stop_the_rollout(
    api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """The artifact job succeeded, then the operator disabled the node before the load
    was created: the load is refused there (not schedulable), which is the node's
    standing, not the template's fault. The replica ends "node_lost", no backoff, and
    the rollout goes on."""
    service_id, bare, new = await new_replica_acquiring(api, sessions)
    await in_thread(api, bare.acquire)
    with api.client() as client:
        ok(patch_node(client, api, str(bare.node_id), enabled=False))
    await step(sessions)
    await assert_lost_not_blamed(sessions, service_id, bare, new.id)
