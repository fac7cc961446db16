"""The gateway over a small fleet, all real: agents that acquired the model through
artifact jobs, runtime workers beside them with real llama-servers, the API with its
pipeline, and the liveness sweep and deployment reconciler as the workers run them.

* routing by role across two deployments on two nodes;
* a node killed mid-invoke: a typed error to the client, the deployment unavailable,
  and back to ready (loaded again) when the node returns;
* a client that disconnects frees the device at once; past a deployment's bound, 429.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from schemas.protocol import (
    GATEWAY_CHAT_COMPLETIONS,
    ROUTE_NODE_HEADER,
)
from store.liveness import LivenessThresholds
from tests.agent.artifact_agent import StartAgent
from tests.agent.harness import admin, wait_until
from tests.api_server import ApiFactory, RunningApi
from tests.deployment_flows import (
    state_after_sweeps,
    until_state,
)
from tests.hub_server import HubServer
from tests.runtime.harness import RuntimeProcess
from tests.runtime.probing import (
    REPO,
    StartRuntime,
    deploy_model,
    gateway,
    node_with_model,
    reported_environment,
    runtime_beside,
)
from tests.runtime_flows import create_profile

# This test's own thresholds (fleet_api starts with them), not tests/flows.py's shorter ones.
THRESHOLDS = LivenessThresholds(stale_after_s=2.0, offline_after_s=4.0)
HELLO: list[Any] = [{"role": "user", "content": "Say hello."}]
LONG: list[Any] = [{"role": "user", "content": "Write a long story about a lighthouse."}]


@pytest.fixture
def fleet_api(api_factory: ApiFactory) -> RunningApi:
    return api_factory(
        job_lease_s=10,
        job_retry_base_s=0.2,
        heartbeat_interval_s=0.5,
        stale_after_s=THRESHOLDS.stale_after_s,
        offline_after_s=THRESHOLDS.offline_after_s,
        gateway_first_token_timeout_s=30,
        gateway_cooldown_s=1,
    )


@dataclass
class FleetNode:
    node_id: str
    agent_config: Path
    runtime: RuntimeProcess
    start_runtime: Any


@pytest.fixture
def fleet(
    fleet_api: RunningApi,
    agents: StartAgent,
    runtimes: StartRuntime,
    hub: HubServer,
    tmp_path: Path,
    llama_server: Path,
    instruct_model: Path,
) -> Iterator[Any]:
    """Start nodes on demand: fleet(name) -> FleetNode, each an agent that acquired the
    model and a runtime worker beside it."""

    def start(name: str) -> FleetNode:
        home = tmp_path / name
        home.mkdir()
        node_id, model_file, state = node_with_model(fleet_api, agents, hub, home, instruct_model)
        roots = [model_file.parents[len(Path(REPO).parts) + 1]]

        def start_runtime() -> RuntimeProcess:
            return runtime_beside(runtimes, fleet_api, state, llama_server, roots, f"rt-{name}")

        runtime = start_runtime()
        reported_environment(fleet_api, node_id, llama_server)
        return FleetNode(node_id, home / "agent.yaml", runtime, start_runtime)

    yield start


def deploy(
    api: RunningApi, node: FleetNode, model: str, ctx_size: int = 1024, **extra: Any
) -> dict[str, Any]:
    environment = next(
        e["id"] for e in admin(api, "GET", "/api/v1/admin/runtime/environments")["items"]
    )
    with api.client() as client:
        profile = create_profile(
            client, api, f"p-{model}", ctx_size=ctx_size, threads=1, server_args={"parallel": 1}
        )
    return deploy_model(api, node.node_id, environment, profile["id"], model, **extra)


def test_a_role_is_routed_across_two_deployments_on_two_nodes(
    fleet_api: RunningApi, fleet: Any
) -> None:
    a, b = fleet("a"), fleet("b")
    deploy(fleet_api, a, "smol-a")
    deploy(fleet_api, b, "smol-b")
    client, _ = gateway(fleet_api, models=["smol-a"], roles=["planner"])
    seen: dict[str, str] = {}

    def both_nodes() -> bool:
        raw = client.chat.completions.with_raw_response.create(
            model="planner", messages=HELLO, max_tokens=2
        )
        assert raw.parse().choices[0].message.content is not None
        seen[raw.headers[ROUTE_NODE_HEADER]] = raw.headers["x-modelforge-route-reason"]
        return len(seen) == 2

    wait_until(both_nodes, 120, "the role served by both nodes")
    assert set(seen) == {a.node_id, b.node_id}
    assert all(reason.startswith("p2c:") for reason in seen.values())
    # A model, not a role: only its own deployment.
    only = client.chat.completions.with_raw_response.create(
        model="smol-a", messages=HELLO, max_tokens=2
    )
    assert only.headers[ROUTE_NODE_HEADER] == a.node_id
    assert only.headers["x-modelforge-route-reason"] == "only"


async def test_a_node_killed_mid_invoke_gives_a_typed_error_and_comes_back_ready(
    fleet_api: RunningApi,
    fleet: Any,
    agents: StartAgent,
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    node = await asyncio.to_thread(fleet, "a")
    deployment = await asyncio.to_thread(deploy, fleet_api, node, "smol")
    client, _ = gateway(fleet_api)
    started = threading.Event()

    def long_stream() -> openai.APIError | None:
        try:
            for _ in client.chat.completions.create(
                model="smol", messages=LONG, max_tokens=2000, stream=True
            ):
                started.set()
        except openai.APIError as failed:
            return failed
        return None

    with ThreadPoolExecutor(1) as pool:
        streamed = pool.submit(long_stream)
        assert await asyncio.to_thread(started.wait, 60)
        node.runtime.kill()  # its llama-server goes with it (parent-death signal)
        agent_pid = next(p for p in _agent_pids(node.agent_config))
        _kill(agent_pid)
        failed = await asyncio.to_thread(streamed.result, 60)
    assert isinstance(failed, openai.APIError), "the cut stream ended without an error"
    assert isinstance(failed.body, dict) and failed.body["code"] == "node_lost"

    def swept() -> Awaitable[str]:
        return state_after_sweeps(sessions, fleet_api, deployment["id"], THRESHOLDS)

    await until_state(swept, "unavailable", 30)
    # The node returns: the agent on the same state dir, a fresh runtime worker (which
    # has nothing loaded). The reconciler loads the deployment again.
    agents(node.agent_config)
    await asyncio.to_thread(node.start_runtime)
    await until_state(swept, "ready", 120)
    answer = await asyncio.to_thread(
        client.chat.completions.create, model="smol", messages=HELLO, max_tokens=2
    )
    assert answer.choices[0].message.content is not None


def test_a_client_that_leaves_frees_the_device_and_a_full_deployment_answers_429(
    fleet_api: RunningApi, fleet: Any
) -> None:
    node = fleet("a")
    deploy(fleet_api, node, "smol", max_concurrent=1, ctx_size=4096)
    client, secret = gateway(fleet_api)
    # A long answer keeps the invoke in flight once it has begun (the small model counts
    # on for its whole token bound). A long prompt did too, but its prefill had to end
    # within the first-token bound, which a loaded box missed.
    counting = [{"role": "user", "content": "Count from 1 to 5000, one number per line."}]
    body = {"model": "smol", "messages": counting, "max_tokens": 2000, "stream": True}
    first_line = threading.Event()
    leave = threading.Event()

    def held_then_left() -> None:
        with (
            httpx.Client(base_url=fleet_api.base_url, timeout=120) as http,
            http.stream(
                "POST",
                GATEWAY_CHAT_COMPLETIONS,
                json=body,
                headers={"Authorization": f"Bearer {secret}"},
            ) as held,
        ):
            assert held.status_code == 200
            # Kept: a line iterator dropped after one line closes the stream with it.
            lines = held.iter_lines()
            next(lines)
            first_line.set()
            leave.wait(60)
            del lines
        # The client closed its stream here.

    def in_flight() -> int:
        deployed = node.runtime.inventory()["deployments"]
        return int(deployed[0]["in_flight"]) if deployed else -1

    with ThreadPoolExecutor(1) as pool:
        holder = pool.submit(held_then_left)
        if not first_line.wait(120):
            holder.result(5)  # its own failure, if it had one
            raise AssertionError("the held stream sent nothing within 120 s")
        assert in_flight() == 1
        # Its one invoke at once is taken: the only deployment is busy.
        with pytest.raises(openai.RateLimitError) as busy:
            client.chat.completions.create(model="smol", messages=HELLO, max_tokens=2)
        assert int(busy.value.response.headers["Retry-After"]) >= 1
        assert isinstance(busy.value.body, dict) and busy.value.body["code"] == "deployment_busy"
        leave.set()
        holder.result(30)
    wait_until(lambda: in_flight() == 0, 5, "the device free at once after the client left")
    answer = client.chat.completions.create(model="smol", messages=HELLO, max_tokens=2)
    assert answer.choices[0].message.content is not None


def _agent_pids(config: Path) -> Iterator[int]:
    import psutil

    for process in psutil.process_iter(["pid", "cmdline"]):
        if str(config) in " ".join(process.info["cmdline"] or []):
            yield int(process.info["pid"])


def _kill(pid: int) -> None:
    import os
    import signal

    os.kill(pid, signal.SIGKILL)
