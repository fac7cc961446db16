"""A real agent process against an API that sheds load (api/shedding.py): its first
heartbeat is refused 429 `overloaded` with Retry-After, it waits as told and comes back,
and once the overload drains it is online with nothing lost."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from pathlib import Path

from tests.agent.harness import (
    FAST_API,
    AgentProcess,
    identity,
    new_token,
    node_detail,
    wait_until,
    write_config,
)
from tests.api_processes import metric
from tests.api_server import RunningApi
from tests.flows import HEARTBEAT, enroll, heartbeat_body
from tests.node_locks import HoldNodeLock

ApiFactory = Callable[..., RunningApi]
StartAgent = Callable[..., AgentProcess]


async def test_a_shed_agent_honours_retry_after_and_comes_online_once_drained(
    api_factory: ApiFactory, agents: StartAgent, lock_holder: HoldNodeLock, tmp_path: Path
) -> None:
    api = api_factory(shed_in_flight=1, **FAST_API)
    with api.client() as client:
        blocker = enroll(client, api, "shed-blocker")
    release = await lock_holder(blocker.node_id)
    async with api.async_client() as fleet:
        # The one place on the transactional path, held by the test's node lock.
        held = asyncio.create_task(
            fleet.post(HEARTBEAT, json=heartbeat_body(blocker.node_id), headers=blocker.headers)
        )
        deadline = time.monotonic() + 20
        while "modelforge_node_requests_waiting 1.0" not in (await fleet.get("/metrics")).text:
            assert time.monotonic() < deadline, "the blocker's heartbeat never went in flight"
            await asyncio.sleep(0.05)
        state = tmp_path / "state"
        agent = agents(
            write_config(
                tmp_path / "agent.yaml",
                api_url=api.base_url,
                state_dir=str(state),
                enrollment_token=new_token(api),
                hostname="gpu-shed-1",
                storage_paths=[str(tmp_path)],
            )
        )
        await asyncio.to_thread(agent.wait_for_log, r"enrolled as node")
        line = await asyncio.to_thread(
            agent.wait_for_log, r"heartbeat failed: [^\n]*status=429[^\n]*code=overloaded[^\n]*"
        )
        assert re.search(r"retrying in \d", line.group(0)), line.group(0)
        node_id = identity(state)["node_id"]
        assert node_detail(api, node_id)["liveness"] == "offline"
        release.set()
        assert (await held).status_code == 200
    wait_until(
        lambda: node_detail(api, node_id)["liveness"] == "online",
        what="the shed agent online once the overload drained",
    )
    with api.client() as client:
        assert metric(client, f'modelforge_requests_shed_total{{route="{HEARTBEAT}"}}') >= 1
