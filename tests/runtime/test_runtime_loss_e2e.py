"""A runtime worker that dies shows as it is, all real: the API with its pipeline, an agent
that acquired the model, the runtime worker beside it with a real llama-server, and the
deployment reconciler as the workers run it. SIGKILLed, the worker's held channel breaks:
the gateway refuses at once, and the admin API shows the deployment `unavailable`
(`runtime_gone`, its node still online) within the grace plus a sweep, not when the node
as a whole would turn offline. Started again (nothing loaded: its llama-server died with
it), the deployment is loaded again and `ready`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable

import openai
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from schemas.protocol import DEPLOYMENTS, NODES
from store.deployments import runtime_channels
from tests.agent.harness import admin
from tests.deployment_flows import RECONCILE_POLICY, deployment, until_state
from tests.runtime.probing import MESSAGES, ProbeNode, deployed, gateway_client
from workers.deployments import reconcile

# The channel's end to the admin API's `unavailable`: the grace, a sweep, the polling;
# far below the node's own offline threshold (90 s).
BOUND_S = runtime_channels.GRACE_S + 10


async def test_a_killed_runtime_worker_is_unavailable_at_once_and_ready_when_back(
    probe_node: ProbeNode, sessions: async_sessionmaker[AsyncSession]
) -> None:
    runtime, environment = await asyncio.to_thread(probe_node.runtime)
    ready = await asyncio.to_thread(deployed, probe_node, environment)
    api = probe_node.api
    client = await asyncio.to_thread(gateway_client, probe_node)

    async def swept() -> str:
        """The reconciler's periodic pass, then the state the admin API shows."""
        await reconcile(sessions, RECONCILE_POLICY)

        def read() -> str:
            with api.client() as http:
                return str(deployment(http, api, ready["id"])["state"])

        return await asyncio.to_thread(read)

    def sweeps() -> Awaitable[str]:
        return swept()

    assert await swept() == "ready"
    await asyncio.to_thread(runtime.kill)  # its llama-server goes with it
    killed = time.monotonic()
    try:
        await asyncio.to_thread(
            client.chat.completions.create, model="smol", messages=MESSAGES, max_tokens=2
        )
        raise AssertionError("a killed runtime worker's deployment took an invoke")
    except openai.APIStatusError as refused:
        assert refused.status_code == 503
    await until_state(sweeps, "unavailable", BOUND_S)
    assert time.monotonic() - killed < BOUND_S
    view = await asyncio.to_thread(admin, api, "GET", f"{DEPLOYMENTS}/{ready['id']}")
    assert view["failure"]["code"] == "runtime_gone"
    node = await asyncio.to_thread(admin, api, "GET", f"{NODES}/{probe_node.node_id}")
    assert node["liveness"] == "online"

    await asyncio.to_thread(runtime.start)
    await until_state(sweeps, "ready", 120)
    answer = await asyncio.to_thread(
        client.chat.completions.create, model="smol", messages=MESSAGES, max_tokens=2
    )
    assert answer.choices[0].message.content is not None, runtime.output[-2000:]
