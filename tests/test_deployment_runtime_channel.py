"""A deployment is shown as the gateway sees it: when its node's runtime channel drops (the
runtime worker killed, crashed) it turns `unavailable` within the grace, its node still
online, with one event per transition however many reconcilers sweep at once, and back
to `ready` when the worker returns and reports it loaded. The truth is in PostgreSQL
(store/deployments/runtime_channels.py), so an API process that died holding the channel, and wrote
no end, is covered too. The real API and PostgreSQL, the reconciler as the workers run
it, the test holding the channel as the runtime worker does (tests/held_channel.py)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from schemas.protocol import RUNTIME_CHANNEL
from store import fleet
from store.deployments import runtime_channels
from store.deployments.tables import RuntimeChannel
from store.liveness import LivenessThresholds
from tests.api_processes import api_processes
from tests.api_server import ApiFactory, RunningApi
from tests.deployment_flows import (
    RECONCILE_POLICY,
    DeployedNode,
    beat,
    deployment,
    ready_deployment,
    state_after_sweeps,
    transitions,
    until_state,
)
from tests.held_channel import channel
from tests.services import db_fetch
from workers.deployments import reconcile

# The channel's end to the view's `unavailable`: the grace, a sweep, the test's polling.
BOUND_S = runtime_channels.GRACE_S + 5


# The presence rules the workers pass by default (store/deployments/rules.py: ReconcilePolicy).
PRESENCE = {"presence_gap_s": 5.0, "restart_grace_s": 30.0}
# The node stays online all along (it beats): only its runtime worker goes.
ONLINE = LivenessThresholds(stale_after_s=30, offline_after_s=90)


@pytest.fixture
def lifecycle_api(api_factory: ApiFactory) -> RunningApi:
    return api_factory(
        stale_after_s=ONLINE.stale_after_s,
        offline_after_s=ONLINE.offline_after_s,
        notification_keepalive_s=1.0,
    )


def swept(
    sessions: async_sessionmaker[AsyncSession], api: RunningApi, deployed: DeployedNode
) -> Callable[[], Awaitable[str]]:
    """One pass of the workers' sweeps, the node beating; then the deployment's state."""

    async def once() -> str:
        with api.client() as client:
            beat(client, deployed.node)
        return await state_after_sweeps(sessions, api, deployed.deployment["id"], ONLINE)

    return once


async def test_a_dropped_runtime_channel_makes_it_unavailable_and_its_return_ready(
    lifecycle_api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> None:
    api = lifecycle_api
    with api.client() as client:
        deployed = ready_deployment(client, api)
    deployment_id = deployed.deployment["id"]
    check = swept(sessions, api, deployed)
    node = deployed.node

    async with channel(api.base_url, node.credential, RUNTIME_CHANNEL):
        # Held (across keep-alives): nothing changes.
        for _ in range(3):
            assert await check() == "ready"
        await asyncio.sleep(1.2)  # one keep-alive passes (part of the scenario)
        assert await check() == "ready"
    lost = time.monotonic()
    await until_state(check, "unavailable", timeout_s=BOUND_S)
    assert time.monotonic() - lost < BOUND_S
    with api.client() as client:
        view = deployment(client, api, deployment_id)
    assert view["failure"]["code"] == "runtime_gone"

    # Still gone: it stays unavailable, even reported loaded by a report sent before.
    assert await check() == "unavailable"

    async with channel(api.base_url, node.credential, RUNTIME_CHANNEL):

        async def returned() -> str:
            with api.client() as client:
                deployed.report(client, loaded=True)
            return await check()

        await until_state(returned, "ready", timeout_s=BOUND_S)
    with api.client() as client:
        assert deployment(client, api, deployment_id)["failure"] is None
    moves = transitions(api, deployment_id)
    assert moves.count(("ready", "unavailable")) == 1
    assert moves[-2:] == [("ready", "unavailable"), ("unavailable", "ready")]


async def test_an_api_that_died_holding_the_channel_leaves_it_to_expire_one_event_per_sweep_race(
    lifecycle_api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """The holder's last write was a keep-alive, and no end came (the API process was
    killed): the row expires by itself. Four reconcilers sweep at once all along: one
    event for the transition."""
    api = lifecycle_api
    with api.client() as client:
        deployed = ready_deployment(client, api)
    deployment_id = deployed.deployment["id"]
    node_id = uuid.UUID(deployed.node.node_id)
    async with sessions() as session, session.begin():
        await runtime_channels.held(session, node_id, uuid.uuid4(), 0.0, opened=True)
    written = time.monotonic()

    async def raced() -> str:
        with api.client() as client:
            beat(client, deployed.node)
        await asyncio.gather(*(reconcile(sessions, RECONCILE_POLICY) for _ in range(4)))
        return await state_after_sweeps(sessions, api, deployment_id, ONLINE)

    await until_state(raced, "unavailable", timeout_s=BOUND_S)
    assert time.monotonic() - written >= runtime_channels.GRACE_S - 0.5
    for _ in range(3):
        assert await raced() == "unavailable"
    assert transitions(api, deployment_id).count(("ready", "unavailable")) == 1


async def test_the_newest_channel_holds_the_row_when_an_older_one_ends(
    lifecycle_api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """A runtime worker reconnects (to another API process) before its old channel's end
    is written: that late end does not count against the new channel, and the old one's
    keep-alive does not take the row back."""
    api = lifecycle_api
    with api.client() as client:
        deployed = ready_deployment(client, api)
    node_id = uuid.UUID(deployed.node.node_id)
    old, new = uuid.uuid4(), uuid.uuid4()

    async def row() -> RuntimeChannel:
        async with sessions() as session:
            found = await session.get(RuntimeChannel, node_id)
            assert found is not None
            return found

    async with sessions() as session, session.begin():
        await runtime_channels.held(session, node_id, old, 15.0, opened=True)
        await runtime_channels.held(session, node_id, new, 15.0, opened=True)
        await runtime_channels.held(session, node_id, old, 15.0, opened=False)
        await runtime_channels.ended(session, node_id, old)
    held = await row()
    assert held.channel_id == new and held.closed_at is None
    async with sessions() as session, session.begin():
        assert not await runtime_channels.gone(session, node_id, **PRESENCE)
        await runtime_channels.ended(session, node_id, new)
    ended = await row()
    assert ended.closed_at is not None
    assert (ended.expires_at - ended.closed_at).total_seconds() <= runtime_channels.GRACE_S


_PRESENCE = text(
    "UPDATE control_plane_presence SET"
    " down_since = statement_timestamp() - make_interval(secs => :down_since),"
    " resumed_at = statement_timestamp() - make_interval(secs => :resumed_at),"
    " last_seen_at = statement_timestamp() - make_interval(secs => :last_seen_at)"
)


async def test_a_lapse_counts_only_while_an_api_could_hold_the_channel(
    sessions: async_sessionmaker[AsyncSession], database_url: str
) -> None:
    """As for liveness: while no API is present nobody can hold a channel, and one that
    lapsed before the last outage of every API ended gets the restart grace from that
    end, the time runtime workers take to find an API again."""
    node_id = uuid.uuid4()
    await db_fetch(
        database_url,
        "INSERT INTO nodes (id, hostname, protocol_version, agent_version)"
        " VALUES ($1, 'channel-host', 1, '0.1')",
        node_id,
    )

    async def gone(down_since: float, resumed_at: float, last_seen_at: float) -> bool:
        """With the API's presence that many seconds ago."""
        ago = {"down_since": down_since, "resumed_at": resumed_at, "last_seen_at": last_seen_at}
        async with sessions() as session, session.begin():
            await session.execute(_PRESENCE, ago)
            return await runtime_channels.gone(session, node_id, **PRESENCE)

    async with sessions() as session, session.begin():
        await fleet.beat(session, gap_s=PRESENCE["presence_gap_s"])
        # Held once, lapsed now (its last keep-alive long past).
        await runtime_channels.held(
            session, node_id, uuid.uuid4(), -runtime_channels.GRACE_S, opened=True
        )
    # An API present all along (the last outage long before): gone.
    assert await gone(down_since=3600, resumed_at=3000, last_seen_at=0)
    # Every API was down and has just come back: not before the grace from their return.
    assert not await gone(down_since=60, resumed_at=0, last_seen_at=0)
    assert await gone(down_since=90, resumed_at=31, last_seen_at=0)
    # No API present now: nothing is concluded.
    assert not await gone(down_since=3600, resumed_at=3000, last_seen_at=10)


async def test_an_api_process_killed_while_holding_the_channel_is_covered_by_its_lapse(
    lifecycle_api: RunningApi,
    sessions: async_sessionmaker[AsyncSession],
    database_url: str,
    tmp_path: Path,
) -> None:
    """The runtime channel is held on a second API process, which is SIGKILLed: it
    writes no end, and the runtime worker (the test) does not reconnect. Its record
    lapses one keep-alive plus the grace after its last write, and the reconciler
    turns the deployment unavailable then."""
    api = lifecycle_api
    with api.client() as client:
        deployed = ready_deployment(client, api)
    check = swept(sessions, api, deployed)
    processes = api_processes(
        1, database_url, api.settings.nats_url, tmp_path, notification_keepalive_s="1"
    )
    with processes as [(url, process)], contextlib.suppress(httpx.RemoteProtocolError):
        # The broken connection ends the held request with an error: expected here.
        async with channel(url, deployed.node.credential, RUNTIME_CHANNEL):
            assert await check() == "ready"
            process.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            await asyncio.to_thread(process.wait, 10)
    await until_state(check, "unavailable", timeout_s=1 + BOUND_S)
    assert time.monotonic() - killed < 1 + BOUND_S
