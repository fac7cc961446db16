"""An invoke the runtime worker cannot run is refused under its own lease, before
llama-server is asked anything (agent/runtime/invoke.py): not loaded here (503
deployment_not_loaded), draining (503 deployment_draining), at its bound (429
deployment_busy), or not a valid invoke (422 invoke_invalid). The refusal goes back to
INVOKE_STREAM (here a stand-in that records it) with the lease, the gateway and the
status in its headers, and an InvokeRefusal body. A delivery that arrives twice runs
once; the channel's events reach the right place."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.client import ProtocolClient
from agent.jobs.wakeups import EventReader, Wakeups
from agent.runtime.channel import RuntimeChannel
from agent.runtime.config import ModelSpec, RuntimeConfig
from agent.runtime.deployed import Deployed
from agent.runtime.invoke import Invokes, run_invoke
from agent.runtime.worker import RuntimeWorker
from schemas.deployments import KINDS
from schemas.gateway import InvokeRefusal
from schemas.jobs import JobKind
from schemas.protocol import (
    INVOKE_EPOCH_HEADER,
    INVOKE_GATEWAY_HEADER,
    INVOKE_LEASE_HEADER,
    INVOKE_STATUS_HEADER,
)
from tests.runtime.deployment_node import GATEWAY, StandIn, invoke, stand_in, until

pytestmark = pytest.mark.fast


@pytest.fixture
def worker(tmp_path: Path) -> RuntimeWorker:
    config = RuntimeConfig(llama_server_path=tmp_path / "llama-server", run_dir=tmp_path / "run")
    return RuntimeWorker(config)


@pytest.fixture
async def node() -> AsyncIterator[tuple[StandIn, ProtocolClient]]:
    async with stand_in() as pair:
        yield pair


def deployed_on(worker: RuntimeWorker, tmp_path: Path, *, max_concurrent: int = 1) -> Deployed:
    """A deployment as the worker keeps it (no server: the refusals come first)."""
    model = ModelSpec(model_id="deploy-000000000001", alias="chat", path=tmp_path / "m.gguf")
    deployed = Deployed(uuid.uuid4(), model, worker.slots[0], max_concurrent)
    worker.deployments[deployed.deployment_id] = deployed
    return deployed


def refusal_of(stand: StandIn, invoke_id: uuid.UUID) -> tuple[int, InvokeRefusal]:
    [streamed] = stand.of(invoke_id)
    assert streamed.headers["content-type"] == "application/json"
    assert streamed.headers[INVOKE_GATEWAY_HEADER.lower()] == GATEWAY
    assert streamed.headers["authorization"] == "Bearer node-credential"
    return int(streamed.headers[INVOKE_STATUS_HEADER.lower()]), InvokeRefusal.model_validate_json(
        streamed.body
    )


async def test_not_loaded_draining_and_busy_are_refused_under_the_invokes_lease(
    worker: RuntimeWorker, tmp_path: Path, node: tuple[StandIn, ProtocolClient]
) -> None:
    stand, client = node
    absent = invoke(uuid.uuid4())
    assert await run_invoke(worker, client, absent) == "refused deployment_not_loaded"
    status, refusal = refusal_of(stand, absent.invoke_id)
    assert (status, refusal.code) == (503, "deployment_not_loaded")
    [streamed] = stand.of(absent.invoke_id)
    assert streamed.headers[INVOKE_LEASE_HEADER.lower()] == str(absent.lease.lease_id)
    assert streamed.headers[INVOKE_EPOCH_HEADER.lower()] == str(absent.lease.epoch)

    deployed = deployed_on(worker, tmp_path, max_concurrent=1)
    # One invoke in flight already (its task stands in): the bound is reached.
    running = asyncio.create_task(asyncio.sleep(30))
    deployed.invokes[uuid.uuid4()] = running
    try:
        busy = invoke(deployed.deployment_id)
        assert await run_invoke(worker, client, busy) == "refused deployment_busy"
        assert refusal_of(stand, busy.invoke_id)[0] == 429
        deployed.draining = True
        drained = invoke(deployed.deployment_id)
        assert await run_invoke(worker, client, drained) == "refused deployment_draining"
        assert refusal_of(stand, drained.invoke_id)[0] == 503
    finally:
        running.cancel()


async def test_a_hostile_invoke_is_refused_invalid_and_an_unreadable_one_dropped(
    worker: RuntimeWorker, tmp_path: Path, node: tuple[StandIn, ProtocolClient]
) -> None:
    stand, client = node
    deployed = deployed_on(worker, tmp_path)
    hostile = invoke(deployed.deployment_id).model_dump(mode="json")
    # A field InvokeParams does not have (it would reach llama-server's body otherwise).
    hostile["params"]["grammar"] = "root ::= [a-z]+"
    assert await run_invoke(worker, client, hostile) == "refused invoke_invalid"
    status, refusal = refusal_of(stand, uuid.UUID(hostile["invoke_id"]))
    assert (status, refusal.code) == (422, "invoke_invalid")
    assert "params.grammar" in refusal.message
    too_many = invoke(deployed.deployment_id).model_dump(mode="json")
    too_many["params"]["max_tokens"] = 10**6
    assert await run_invoke(worker, client, too_many) == "refused invoke_invalid"
    # Without a lease to answer under, nothing is sent.
    del too_many["lease"]
    assert await run_invoke(worker, client, json.dumps(too_many)) == "dropped"
    assert deployed.in_flight == 0


async def test_a_second_delivery_of_the_same_invoke_runs_once(
    worker: RuntimeWorker, tmp_path: Path, node: tuple[StandIn, ProtocolClient]
) -> None:
    stand, client = node
    invokes = Invokes(worker, client)
    once = invoke(uuid.uuid4())
    assert invokes.deliver(once.model_dump_json())
    assert not invokes.deliver(once.model_dump_json())
    await until(lambda: not invokes.running, 10, "the invoke ended")
    assert len(stand.of(once.invoke_id)) == 1
    # A newer epoch of it (the gateway retried) is a new delivery; an older one is not.
    newer = once.model_copy(update={"lease": once.lease.model_copy(update={"epoch": 2})})
    assert invokes.deliver(newer.model_dump_json())
    await until(lambda: not invokes.running, 10, "the retried invoke ended")
    assert len(stand.of(once.invoke_id)) == 2


async def test_channel_events_wake_loops_start_and_cancel_invokes(
    worker: RuntimeWorker, node: tuple[StandIn, ProtocolClient]
) -> None:
    stand, client = node
    wakeups = Wakeups()
    runtime = wakeups.loop_for([JobKind.RUNTIME_PROBE])
    deployments = wakeups.loop_for(KINDS)
    invokes = Invokes(worker, client)
    channel = RuntimeChannel(client, wakeups, invokes)
    reader = EventReader()
    delivered = invoke(uuid.uuid4())
    stream = (
        "retry: 2000\n: connected\n\n"
        'event: job\ndata: {"event": "job.created", "job_id": "x", '
        '"kind": "deployment.load.v1"}\n\n'
        f"event: invoke\ndata: {delivered.model_dump_json()}\n\n"
        f'event: cancel\ndata: {{"invoke_id": "{delivered.invoke_id}"}}\n\n'
        "event: cancel\ndata: not json\n\n"
    )
    for line in stream.split("\n"):
        if (event := reader.feed(line)) is not None:
            channel.on_event(*event)
    assert deployments.is_set() and not runtime.is_set()
    # Started at once, then cancelled before it answered anything.
    [(_, task)] = invokes.running.values()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert stand.of(delivered.invoke_id) == []
