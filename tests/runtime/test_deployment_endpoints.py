"""A deployment's endpoints and chat template on an in-process runtime worker with the
real llama-server and SmolLM2 (issue 34): `chatml-tools` loads the shipped template
and the load reports that it calls tools (SmolLM2's own ChatML template cannot);
embeddings with a pooling load and answer; embeddings without one fail the load as
`embeddings_unavailable`, not the first client's request."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent.runtime.deployments import DeploymentJob
from agent.runtime.worker import RuntimeWorker
from schemas.deployments import LoadClaim, LoadComplete, LoadSpec
from schemas.endpoints import ChatTemplateCaps
from schemas.runtime import RuntimeFailure
from tests.runtime.deployment_node import Reports, digest, lease, started_worker

# SmolLM2's hidden size: one embedding's length.
EMBEDDING_SIZE = 576


@pytest.fixture
async def worker(
    tmp_path: Path, llama_server: Path, instruct_model: Path
) -> AsyncIterator[RuntimeWorker]:
    async with started_worker(tmp_path / "run", llama_server, instruct_model) as running:
        yield running


def claim(binary: Path, model: Path, endpoints: list[str], **settings: Any) -> LoadClaim:
    spec = LoadSpec(
        deployment_id=uuid.uuid4(), model="smol", device_id="cpu",
        artifact_path=str(model), artifact_digest=digest(model), profile_id=uuid.uuid4(),
        profile_version=1, settings={"ctx_size": 1024, "threads": 2, **settings},
        environment_id=uuid.uuid4(), binary_sha256=digest(binary), max_concurrent=2,
        endpoints=endpoints,
    )  # fmt: skip
    return LoadClaim(job_id=uuid.uuid4(), attempt=1, spec=spec, lease=lease())


async def test_the_shipped_tools_template_loads_and_calls_tools(
    worker: RuntimeWorker, llama_server: Path, instruct_model: Path
) -> None:
    reports = Reports()
    load = claim(llama_server, instruct_model, ["chat"], chat_template="chatml-tools")
    assert await DeploymentJob(load, reports, worker).run() == "completed"
    [loaded] = reports.completed
    assert isinstance(loaded, LoadComplete) and loaded.health.inference_ok
    assert loaded.capabilities == ChatTemplateCaps(
        supports_tools=True, supports_tool_calls=True, supports_parallel_tool_calls=True
    )
    server = worker.slots[0].server
    assert server is not None
    # The template renders as ChatML from its first byte (its licence note is a comment
    # that leaves nothing behind), with the neutral system line.
    rendered = await server.http.post(
        "/apply-template", json={"messages": [{"role": "user", "content": "hi"}]}
    )
    assert rendered.json()["prompt"] == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


async def test_embeddings_with_a_pooling_load_and_answer(
    worker: RuntimeWorker, llama_server: Path, instruct_model: Path
) -> None:
    reports = Reports()
    load = claim(
        llama_server, instruct_model, ["chat", "embeddings"], server_args={"pooling": "mean"}
    )
    assert await DeploymentJob(load, reports, worker).run() == "completed"
    [loaded] = reports.completed
    assert loaded.health.inference_ok
    # SmolLM2's own template: plain ChatML, no tools.
    assert loaded.capabilities is not None and not loaded.capabilities.supports_tool_calls
    server = worker.slots[0].server
    assert server is not None
    embedded = await server.http.post("/v1/embeddings", json={"model": "smol", "input": "hi"})
    assert embedded.status_code == 200, embedded.text
    assert len(embedded.json()["data"][0]["embedding"]) == EMBEDDING_SIZE


async def test_embeddings_without_a_pooling_fail_the_load_with_why(
    worker: RuntimeWorker, llama_server: Path, instruct_model: Path
) -> None:
    reports = Reports()
    load = claim(llama_server, instruct_model, ["embeddings"])
    outcome = await DeploymentJob(load, reports, worker).run()
    assert outcome == RuntimeFailure.EMBEDDINGS_UNAVAILABLE
    [failed] = reports.failed
    assert failed.code == RuntimeFailure.EMBEDDINGS_UNAVAILABLE and not failed.retryable
    assert "set pooling in the profile" in failed.detail
    # Nothing stays pinned or running: the device is free for the next load.
    assert worker.slots[0].pinned is None and worker.slots[0].server is None
