"""The simulated runtime (agent/sim_runtime.py, agent/sim_answers.py) answers each
invoke kind in llama-server's shape for its endpoint, posted to INVOKE_STREAM (here the
stand-in that records it) as the real worker posts llama-server's bytes: chat and
completions whole or streamed, embeddings whole (small unit vectors, floats or base64
with `usage.prompt_tokens`); an endpoint the deployment's load did not declare is
refused `endpoint_not_served` (404), as the real worker refuses it."""

from __future__ import annotations

import base64
import json
import math
import struct
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agent.client import ProtocolClient
from agent.sim_answers import EMBEDDING_SIZE
from agent.sim_runtime import RuntimeOptions, SimDeployment, SimRuntime
from schemas.endpoints import Endpoint
from schemas.gateway import Invoke, InvokeRefusal
from schemas.protocol import INVOKE_STATUS_HEADER
from tests.runtime.deployment_node import GATEWAY, StandIn, stand_in

pytestmark = pytest.mark.fast

CHAT: dict[str, Any] = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
COMPLETION: dict[str, Any] = {"endpoint": "completions", "prompt": "Once", "max_tokens": 3}
EMBEDDINGS: dict[str, Any] = {"endpoint": "embeddings", "input": ["a", "b", "a"]}


@pytest.fixture
async def node() -> AsyncIterator[tuple[StandIn, ProtocolClient]]:
    async with stand_in() as pair:
        yield pair


def _simulated(
    client: ProtocolClient, endpoints: list[Endpoint]
) -> tuple[SimRuntime, SimDeployment]:
    runtime = SimRuntime(uuid.uuid4(), RuntimeOptions(tokens_per_s=1000), client, client)
    deployed = SimDeployment(uuid.uuid4(), "gpu:0", "smol", 2, 1, endpoints=endpoints)
    runtime.deployments[deployed.deployment_id] = deployed
    return runtime, deployed


async def _answer(
    node: tuple[StandIn, ProtocolClient],
    params: dict[str, Any],
    endpoints: list[Endpoint] | None = None,
) -> tuple[str, int, bytes]:
    stand, client = node
    runtime, deployed = _simulated(client, endpoints or ["chat", "completions", "embeddings"])
    invoke = Invoke.model_validate({
        "invoke_id": str(uuid.uuid4()), "deployment_id": str(deployed.deployment_id),
        "gateway": GATEWAY, "lease": {"lease_id": str(uuid.uuid4()), "epoch": 1},
        "params": params,
    })  # fmt: skip
    outcome = await runtime.run_invoke(invoke)
    [streamed] = stand.of(invoke.invoke_id)
    assert not deployed.invokes
    return outcome, int(streamed.headers[INVOKE_STATUS_HEADER.lower()]), streamed.body


def _events(body: bytes) -> list[Any]:
    lines = [line for line in body.decode().split("\n") if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]", body
    return [json.loads(line[len("data: ") :]) for line in lines[:-1]]


async def test_chat_and_completions_whole_and_streamed(
    node: tuple[StandIn, ProtocolClient],
) -> None:
    _, status, body = await _answer(node, CHAT)
    answer = json.loads(body)
    assert (status, answer["object"]) == (200, "chat.completion")
    assert answer["choices"][0]["message"]["content"] == "tok0 tok1 tok2 "
    events = _events((await _answer(node, {**CHAT, "stream": True, "include_usage": True}))[2])
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[1:-1]) == (
        "tok0 tok1 tok2 "
    )
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 3

    _, status, body = await _answer(node, {**COMPLETION, "prompt": ["a", "b"]})
    answer = json.loads(body)
    assert (status, answer["object"]) == (200, "text_completion")
    assert [c["text"] for c in answer["choices"]] == ["tok0 tok1 tok2 "] * 2
    assert [c["index"] for c in answer["choices"]] == [0, 1]
    # Every prompt counted, as the real worker sums a list's answers.
    assert answer["usage"] == {"prompt_tokens": 16, "completion_tokens": 6, "total_tokens": 22}
    events = _events((await _answer(node, {**COMPLETION, "stream": True}))[2])
    assert all(e["object"] == "text_completion" for e in events)
    assert "".join(e["choices"][0]["text"] for e in events) == "tok0 tok1 tok2 "
    # The usage rides on the final choice's event, as llama-server sends a completion's.
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["usage"]["completion_tokens"] == 3


async def test_embeddings_in_openais_shape_as_floats_or_base64(
    node: tuple[StandIn, ProtocolClient],
) -> None:
    _, status, body = await _answer(node, EMBEDDINGS)
    answer = json.loads(body)
    assert (status, answer["object"]) == (200, "list")
    assert answer["usage"]["prompt_tokens"] == answer["usage"]["total_tokens"] > 0
    vectors = [item["embedding"] for item in sorted(answer["data"], key=lambda i: i["index"])]
    assert [len(v) for v in vectors] == [EMBEDDING_SIZE] * 3
    assert math.isclose(sum(x * x for x in vectors[0]), 1.0)
    assert vectors[0] == vectors[2] != vectors[1]
    _, status, body = await _answer(node, {**EMBEDDINGS, "encoding_format": "base64"})
    for item in json.loads(body)["data"]:
        assert item["encoding_format"] == "base64"
        decoded = struct.unpack(f"<{EMBEDDING_SIZE}f", base64.b64decode(item["embedding"]))
        assert decoded == pytest.approx(vectors[item["index"]], abs=1e-6)


async def test_an_endpoint_not_declared_is_refused(
    node: tuple[StandIn, ProtocolClient],
) -> None:
    for params in (COMPLETION, EMBEDDINGS):
        outcome, status, body = await _answer(node, params, endpoints=["chat"])
        assert (outcome, status) == ("refused endpoint_not_served", 404)
        assert InvokeRefusal.model_validate_json(body).code == "endpoint_not_served"
