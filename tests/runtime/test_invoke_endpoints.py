"""Completions and embeddings invokes on an in-process runtime worker with the real
llama-server and SmolLM2 (issue 34, design §1.4): one deployment serving chat,
completions and embeddings (a `pooling: mean` profile) answers each kind on its own
path, relayed to INVOKE_STREAM (here the stand-in that records it) as llama-server
wrote it: a completion whole and streamed (its usage on the final choice's event);
a list of prompts asked one by one (agent/runtime/completion_list.py) and answered as
one completion with the usage of all; embeddings as floats and as base64 of the same
values, and each input's vector the same alone as inside a batch of 8."""

from __future__ import annotations

import base64
import contextlib
import json
import math
import struct
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent.client import ProtocolClient
from agent.runtime.deployments import DeploymentJob
from agent.runtime.invoke import run_invoke
from agent.runtime.worker import RuntimeWorker
from schemas.deployments import LoadClaim, LoadSpec
from schemas.gateway import Invoke
from schemas.protocol import INVOKE_STATUS_HEADER
from tests.runtime.deployment_node import (
    GATEWAY,
    Reports,
    StandIn,
    digest,
    lease,
    stand_in,
    started_worker,
)

# SmolLM2's hidden size: one embedding's length.
EMBEDDING_SIZE = 576


@contextlib.asynccontextmanager
async def _loaded(
    run: Path, llama_server: Path, instruct_model: Path, server_args: dict[str, Any]
) -> AsyncIterator[tuple[RuntimeWorker, uuid.UUID]]:
    """A worker with one deployment loaded that serves all three endpoints."""
    async with started_worker(run, llama_server, instruct_model) as worker:
        spec = LoadSpec(
            deployment_id=uuid.uuid4(), model="smol", device_id="cpu",
            artifact_path=str(instruct_model), artifact_digest=digest(instruct_model),
            profile_id=uuid.uuid4(), profile_version=1,
            settings={"ctx_size": 1024, "threads": 2, "server_args": server_args},
            environment_id=uuid.uuid4(), binary_sha256=digest(llama_server),
            max_concurrent=2, endpoints=["chat", "completions", "embeddings"],
        )  # fmt: skip
        load = LoadClaim(job_id=uuid.uuid4(), attempt=1, spec=spec, lease=lease())
        reports = Reports()
        assert await DeploymentJob(load, reports, worker).run() == "completed", reports.failed
        yield worker, spec.deployment_id


@pytest.fixture
async def served(
    tmp_path: Path, llama_server: Path, instruct_model: Path
) -> AsyncIterator[tuple[RuntimeWorker, uuid.UUID]]:
    async with _loaded(tmp_path / "run", llama_server, instruct_model, {"pooling": "mean"}) as d:
        yield d


@pytest.fixture
async def node() -> AsyncIterator[tuple[StandIn, ProtocolClient]]:
    async with stand_in() as pair:
        yield pair


async def _answer(
    served: tuple[RuntimeWorker, uuid.UUID],
    node: tuple[StandIn, ProtocolClient],
    params: dict[str, Any],
) -> tuple[int, str, bytes]:
    """Run one invoke of `params`: the status, content type and body streamed back."""
    worker, deployment_id = served
    stand, client = node
    invoke = Invoke.model_validate({
        "invoke_id": str(uuid.uuid4()), "deployment_id": str(deployment_id),
        "gateway": GATEWAY, "lease": {"lease_id": str(uuid.uuid4()), "epoch": 1},
        "params": params,
    })  # fmt: skip
    assert await run_invoke(worker, client, invoke) == "relayed"
    [streamed] = stand.of(invoke.invoke_id)
    headers = streamed.headers
    assert worker.deployments[deployment_id].in_flight == 0
    return int(headers[INVOKE_STATUS_HEADER.lower()]), headers["content-type"], streamed.body


def _events(body: bytes) -> list[Any]:
    lines = [line for line in body.decode().split("\n") if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]", body
    return [json.loads(line[len("data: ") :]) for line in lines[:-1]]


async def test_completions_plain_and_streamed(
    served: tuple[RuntimeWorker, uuid.UUID], node: tuple[StandIn, ProtocolClient]
) -> None:
    completion = {"endpoint": "completions", "prompt": "Once upon a time", "max_tokens": 4}
    status, content_type, body = await _answer(served, node, {**completion, "seed": 1})
    assert (status, content_type.split(";")[0]) == (200, "application/json"), body
    answer = json.loads(body)
    assert answer["object"] == "text_completion" and answer["model"] == "smol"
    [choice] = answer["choices"]
    assert isinstance(choice["text"], str) and choice["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 4

    streamed = {**completion, "stream": True, "include_usage": True}
    status, content_type, body = await _answer(served, node, streamed)
    assert (status, content_type.split(";")[0]) == (200, "text/event-stream"), body
    events = _events(body)
    # The usage rides on the final choice's event (llama-server's completions shape).
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["usage"]["completion_tokens"] == 4


async def test_a_list_of_prompts_is_asked_one_by_one_and_its_usage_summed(
    served: tuple[RuntimeWorker, uuid.UUID], node: tuple[StandIn, ProtocolClient]
) -> None:
    # Greedy, so each prompt's answer alone is the same as within the list.
    greedy = {"endpoint": "completions", "max_tokens": 3, "temperature": 0.0}
    alone = []
    for prompt in ("Once upon a time", "The capital of France is"):
        status, _, body = await _answer(served, node, {**greedy, "prompt": prompt})
        assert status == 200, body
        alone.append(json.loads(body))
    listed = {**greedy, "prompt": ["Once upon a time", "The capital of France is"]}
    status, content_type, body = await _answer(served, node, listed)
    assert (status, content_type) == (200, "application/json"), body
    answer = json.loads(body)
    assert answer["object"] == "text_completion" and answer["model"] == "smol"
    assert [c["index"] for c in answer["choices"]] == [0, 1]
    assert [c["text"] for c in answer["choices"]] == [a["choices"][0]["text"] for a in alone]
    # llama-server's own answer to the list counted one prompt's tokens (obs); the
    # worker's counts both, as the gateway meters them.
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert answer["usage"][key] == sum(a["usage"][key] for a in alone), key

    # A prompt over the context (1024 tokens) fails the whole invoke with llama-server's
    # own refusal, though the first prompt was answered.
    too_long = {**greedy, "prompt": ["Once", "word " * 3000]}
    status, _, body = await _answer(served, node, too_long)
    assert status == 400, body
    refusal = json.loads(body)
    assert "choices" not in refusal and "error" in refusal
    # The first prompt was generated all the same: its usage rides on the refusal, for
    # the gateway to meter (api/gateway/call.py: _passthrough).
    status, _, body = await _answer(served, node, {**greedy, "prompt": "Once"})
    assert status == 200, body
    alone_usage = json.loads(body)["usage"]
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert refusal["usage"][key] == alone_usage[key], key


async def test_embeddings_as_floats_and_as_base64_of_the_same_values(
    served: tuple[RuntimeWorker, uuid.UUID], node: tuple[StandIn, ProtocolClient]
) -> None:
    embeddings = {"endpoint": "embeddings", "input": ["hello", "world"]}
    status, content_type, body = await _answer(served, node, embeddings)
    assert (status, content_type.split(";")[0]) == (200, "application/json"), body
    answer = json.loads(body)
    assert answer["object"] == "list" and answer["usage"]["prompt_tokens"] > 0
    floats = {item["index"]: item["embedding"] for item in answer["data"]}
    assert sorted(floats) == [0, 1]
    assert all(len(vector) == EMBEDDING_SIZE for vector in floats.values())

    status, _, body = await _answer(served, node, {**embeddings, "encoding_format": "base64"})
    assert status == 200, body
    for item in json.loads(body)["data"]:
        packed = base64.b64decode(item["embedding"])
        decoded = struct.unpack(f"<{EMBEDDING_SIZE}f", packed)
        assert decoded == pytest.approx(floats[item["index"]], abs=1e-6)


async def test_chat_still_answers_on_the_same_deployment(
    served: tuple[RuntimeWorker, uuid.UUID], node: tuple[StandIn, ProtocolClient]
) -> None:
    chat = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 2}
    status, _, body = await _answer(served, node, chat)
    assert status == 200, body
    assert json.loads(body)["object"] == "chat.completion"


async def test_an_empty_prompt_leaves_the_server_answering(
    served: tuple[RuntimeWorker, uuid.UUID], node: tuple[StandIn, ProtocolClient]
) -> None:
    """The wire lets a prompt be "" (OpenAI's does): whatever llama-server answers it,
    alone, in a list or streamed, the deployment still answers the next request."""
    base = {"endpoint": "completions", "max_tokens": 2}
    seen = []
    for prompt in ("", ["", "Once"], ["Once", ""]):
        status, _, body = await _answer(served, node, {**base, "prompt": prompt})
        seen.append((status, body[:200]))
        assert status in (200, 400), body
    status, _, body = await _answer(served, node, {**base, "prompt": "", "stream": True})
    seen.append((status, body[:200]))
    status, _, body = await _answer(served, node, {**base, "prompt": "Once"})
    assert status == 200, (body, seen)


# Texts of 1 to 21 tokens: batched, the shorter ones cut the longer ones into pieces
# when each slot has a KV buffer of its own.
TEXTS = [
    "The cat sat on the mat.", "Quantum chromodynamics describes the strong force.", "hello",
    "Paris is the capital of France, and it is known for the Eiffel Tower.",
    "def f(x): return x * 2", "12345 67890", "Bonjour tout le monde",
    "A longer sentence that goes on about nothing in particular, so its tokens differ.",
]  # fmt: skip


async def test_an_input_gets_the_same_vector_alone_and_in_a_batch(
    tmp_path: Path, llama_server: Path, instruct_model: Path,
    node: tuple[StandIn, ProtocolClient],
) -> None:  # fmt: skip
    """A profile that sets `parallel` (llama-server then gives each slot its own KV
    buffer unless told otherwise) still embeds a text as it does alone: observed
    without `--kv-unified`, cosine 0.65 for the second text here."""
    settings = {"pooling": "mean", "parallel": 4}
    async with _loaded(tmp_path / "run", llama_server, instruct_model, settings) as served:
        status, _, body = await _answer(served, node, {"endpoint": "embeddings", "input": TEXTS})
        assert status == 200, body
        batched = {item["index"]: item["embedding"] for item in json.loads(body)["data"]}
        for index, text in enumerate(TEXTS):
            status, _, body = await _answer(
                served, node, {"endpoint": "embeddings", "input": [text]}
            )
            assert status == 200, body
            [alone] = json.loads(body)["data"]
            assert _cosine(alone["embedding"], batched[index]) > 1 - 1e-4, text


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
