"""An invoke the runtime worker cannot run is refused under its own lease, before
llama-server is asked anything (agent/runtime/invoke.py): not loaded here (503
deployment_not_loaded), for an endpoint the deployment does not serve (404
endpoint_not_served), draining (503 deployment_draining), at its bound (429
deployment_busy), or not a valid invoke (422 invoke_invalid, completions' and
embeddings' params as well as chat's). The refusal goes back to
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
from schemas.endpoints import Endpoint, default_endpoints
from schemas.gateway import Invoke, InvokeRefusal
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


def deployed_on(
    worker: RuntimeWorker,
    tmp_path: Path,
    *,
    max_concurrent: int = 1,
    endpoints: list[Endpoint] | None = None,
) -> Deployed:
    """A deployment as the worker keeps it (no server: the refusals come first)."""
    model = ModelSpec(model_id="deploy-000000000001", alias="chat", path=tmp_path / "m.gguf",
                      endpoints=endpoints or default_endpoints())  # fmt: skip
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
    # The location names the params' kind (the union's tag: a chat invoke names none).
    assert "params.chat.grammar" in refusal.message
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


def _schema_nested(levels: int) -> dict[str, object]:
    schema: dict[str, object] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema}
    return {"type": "object", "properties": {"x": schema}}


HOSTILE_FIELDS: list[tuple[str, dict[str, object]]] = [
    ("$ref loop", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "$defs": {"A": {"$ref": "#/$defs/A"}},
        "properties": {"a": {"$ref": "#/$defs/A"}}}}}]}),
    ("40-deep schema", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "deep", "schema": _schema_nested(40)}}}),
    ("tool name a/b", {"tools": [{"type": "function", "function": {"name": "a/b"}}]}),
    ("top_logprobs alone", {"top_logprobs": 2}),
    ("tool_choice without tools", {"tool_choice": "required"}),
]  # fmt: skip


@pytest.mark.parametrize(
    "fields", [h[1] for h in HOSTILE_FIELDS], ids=[h[0] for h in HOSTILE_FIELDS]
)
async def test_hostile_tools_and_schemas_are_refused_on_the_node_too(
    worker: RuntimeWorker,
    tmp_path: Path,
    node: tuple[StandIn, ProtocolClient],
    fields: dict[str, object],
) -> None:
    """The node is a trust boundary: a control plane that let one through (or a forged
    delivery) still gets invoke_invalid, and llama-server is never asked."""
    stand, client = node
    deployed = deployed_on(worker, tmp_path)
    hostile = invoke(deployed.deployment_id).model_dump(mode="json")
    hostile["params"].update(fields)
    assert await run_invoke(worker, client, hostile) == "refused invoke_invalid"
    status, refusal = refusal_of(stand, uuid.UUID(hostile["invoke_id"]))
    assert (status, refusal.code) == (422, "invoke_invalid")
    assert deployed.in_flight == 0


def _of_kind(deployment_id: uuid.UUID, params: dict[str, object]) -> Invoke:
    return Invoke.model_validate({
        "invoke_id": str(uuid.uuid4()), "deployment_id": str(deployment_id),
        "gateway": GATEWAY, "lease": {"lease_id": str(uuid.uuid4()), "epoch": 1},
        "params": params,
    })  # fmt: skip


COMPLETION: dict[str, object] = {"endpoint": "completions", "prompt": "Once", "max_tokens": 8}
EMBEDDINGS: dict[str, object] = {"endpoint": "embeddings", "input": ["hello"]}


async def test_an_endpoint_the_deployment_does_not_serve_is_refused_before_llama_server(
    worker: RuntimeWorker, tmp_path: Path, node: tuple[StandIn, ProtocolClient]
) -> None:
    """Refused at admission, 404 endpoint_not_served (the gateway tries another route):
    an endpoint it serves goes on to ask llama-server (none runs here: 503)."""
    stand, client = node
    deployed = deployed_on(worker, tmp_path, endpoints=["chat"])
    for params in (COMPLETION, EMBEDDINGS, {**COMPLETION, "stream": True}):
        unserved = _of_kind(deployed.deployment_id, params)
        assert await run_invoke(worker, client, unserved) == "refused endpoint_not_served"
        status, refusal = refusal_of(stand, unserved.invoke_id)
        assert (status, refusal.code) == (404, "endpoint_not_served")
        assert deployed.in_flight == 0 and not deployed.invokes
    # Chat, which it serves, passes admission and reaches for the (absent) server.
    served = invoke(deployed.deployment_id)
    assert await run_invoke(worker, client, served) == "refused upstream_unavailable"
    # The default endpoints are chat and completions: embeddings are not among them.
    default = deployed_on(worker, tmp_path)
    completion = _of_kind(default.deployment_id, COMPLETION)
    assert await run_invoke(worker, client, completion) == "refused upstream_unavailable"
    embeddings = _of_kind(default.deployment_id, EMBEDDINGS)
    assert await run_invoke(worker, client, embeddings) == "refused endpoint_not_served"
    assert default.in_flight == 0


HOSTILE_KINDS: list[tuple[str, dict[str, object]]] = [
    ("completion suffix", {**COMPLETION, "suffix": "end"}),
    ("completion echo", {**COMPLETION, "echo": True}),
    ("completion logprobs", {**COMPLETION, "logprobs": 5}),
    ("completion grammar", {**COMPLETION, "grammar": "root ::= [a-z]+"}),
    ("completion token ids", {**COMPLETION, "prompt": [[1, 2, 3]]}),
    ("completion messages", {**COMPLETION, "messages": [{"role": "user", "content": "x"}]}),
    ("completion streamed list", {**COMPLETION, "prompt": ["a", "b"], "stream": True}),
    ("completion 17 prompts", {**COMPLETION, "prompt": ["a"] * 17}),
    ("completion past the bound", {**COMPLETION, "max_tokens": 10**6}),
    ("embeddings streamed", {**EMBEDDINGS, "stream": True}),
    ("embeddings dimensions", {**EMBEDDINGS, "dimensions": 8}),
    ("embeddings token ids", {**EMBEDDINGS, "input": [[1, 2, 3]]}),
    ("embeddings a bare string", {**EMBEDDINGS, "input": "hello"}),
    ("embeddings 257 inputs", {**EMBEDDINGS, "input": ["a"] * 257}),
    ("embeddings binary", {**EMBEDDINGS, "encoding_format": "binary"}),
    ("embeddings pooling", {**EMBEDDINGS, "pooling": "none"}),
    ("an unknown endpoint", {**EMBEDDINGS, "endpoint": "rerank"}),
]  # fmt: skip


@pytest.mark.parametrize("params", [h[1] for h in HOSTILE_KINDS], ids=[h[0] for h in HOSTILE_KINDS])
async def test_hostile_completion_and_embeddings_params_are_refused_invalid(
    worker: RuntimeWorker,
    tmp_path: Path,
    node: tuple[StandIn, ProtocolClient],
    params: dict[str, object],
) -> None:
    """Delivered raw (a forged or faulty control plane): invoke_invalid, never admitted."""
    stand, client = node
    deployed = deployed_on(worker, tmp_path, endpoints=["chat", "completions", "embeddings"])
    hostile = invoke(deployed.deployment_id).model_dump(mode="json")
    hostile["params"] = params
    assert await run_invoke(worker, client, hostile) == "refused invoke_invalid"
    status, refusal = refusal_of(stand, uuid.UUID(hostile["invoke_id"]))
    assert (status, refusal.code) == (422, "invoke_invalid")
    assert deployed.in_flight == 0
