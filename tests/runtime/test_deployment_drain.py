"""Invokes on a loaded deployment, and its drain and unload, on an in-process runtime
worker with a real llama-server and a real model; INVOKE_STREAM is a stand-in that
records what came back (the end-to-end tests run against the real API).

* An invoke's answer goes back as llama-server gave it (status, content type, bytes),
  streamed or not, under the served name.
* A cancel, or the API refusing the stream, closes the llama-server connection: the
  device stops generating at once.
* A drain refuses new invokes, lets those in flight finish within its deadline, then
  unloads and unpins; an unload (deadline 0) cuts what runs, whose stream ends with
  the error event."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.client import ProtocolClient
from agent.runtime.api import STREAM_FAILED
from agent.runtime.deployments import DeploymentJob
from agent.runtime.invoke import Invokes, run_invoke
from agent.runtime.server import LlamaServer
from agent.runtime.worker import RuntimeWorker
from schemas.deployments import DrainComplete, UnloadComplete
from schemas.jobs import JobKind
from schemas.protocol import INVOKE_STATUS_HEADER
from tests.runtime.deployment_node import (
    Reports,
    StandIn,
    invoke,
    load_claim,
    stand_in,
    started_worker,
    target_claim,
    until,
)

STORY = [{"role": "user", "content": "Write a very long story about a dragon, in chapters."}]
DONE = b"data: [DONE]"


@pytest.fixture
async def worker(
    tmp_path: Path, llama_server: Path, instruct_model: Path
) -> AsyncIterator[RuntimeWorker]:
    async with started_worker(tmp_path / "run", llama_server, instruct_model) as running:
        yield running


@pytest.fixture
async def node() -> AsyncIterator[tuple[StandIn, ProtocolClient]]:
    async with stand_in() as pair:
        yield pair


async def loaded(worker: RuntimeWorker, binary: Path, model: Path) -> uuid.UUID:
    deployment_id = uuid.uuid4()
    reports = Reports()
    claim = load_claim(deployment_id, binary, model, served="smol-chat", max_concurrent=2)
    assert await DeploymentJob(claim, reports, worker).run() == "completed", reports.failed
    return deployment_id


async def generating(server: LlamaServer) -> bool:
    slots = (await server.http.get("/slots")).json()
    return any(slot["is_processing"] for slot in slots)


async def until_idle(server: LlamaServer, timeout_s: float) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if not await generating(server):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"llama-server still generating after {timeout_s}s")


async def test_answers_stream_back_and_a_cancel_or_a_refused_stream_frees_the_device(
    worker: RuntimeWorker,
    node: tuple[StandIn, ProtocolClient],
    llama_server: Path,
    instruct_model: Path,
) -> None:
    stand, client = node
    deployment_id = await loaded(worker, llama_server, instruct_model)
    server = worker.deployments[deployment_id].server
    assert server is not None

    streamed = invoke(deployment_id, stream=True, include_usage=True, temperature=0)
    assert await asyncio.create_task(run_invoke(worker, client, streamed)) == "relayed"
    [answer] = stand.of(streamed.invoke_id)
    assert answer.headers[INVOKE_STATUS_HEADER.lower()] == "200"
    assert answer.headers["content-type"].startswith("text/event-stream")
    assert answer.body.rstrip().endswith(DONE)
    events = [json.loads(line.removeprefix(b"data: ")) for line in answer.body.splitlines()
              if line.startswith(b"data: {")]  # fmt: skip
    assert events[0]["model"] == "smol-chat" and events[-1]["usage"]["completion_tokens"] > 0

    whole = invoke(deployment_id, max_tokens=4)
    assert await asyncio.create_task(run_invoke(worker, client, whole)) == "relayed"
    [answer] = stand.of(whole.invoke_id)
    assert answer.headers["content-type"].startswith("application/json")
    body = json.loads(answer.body)
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] <= 4

    # A long answer, cancelled once it is under way: the device stops at once.
    invokes = Invokes(worker, client)
    long = invoke(deployment_id, messages=STORY, max_tokens=2000, stream=True, temperature=1.0)
    assert invokes.deliver(long.model_dump_json())
    await until(lambda: stand.of(long.invoke_id), 30, "the answer's stream")
    await asyncio.wait_for(stand.of(long.invoke_id)[0].arrived.wait(), 30)
    assert worker.deployments[deployment_id].in_flight == 1
    assert worker.inventory().deployments[0].in_flight == 1
    assert await generating(server)
    assert invokes.cancel(long.invoke_id)
    await until(lambda: not invokes.running, 5, "the cancelled invoke's end")
    await until_idle(server, 5)
    assert worker.deployments[deployment_id].in_flight == 0

    # The API refusing the stream (the gateway retried elsewhere: 409) stops it too.
    stand.refuse_at_once = 409
    refused = invoke(deployment_id, messages=STORY, max_tokens=2000, stream=True)
    outcome = await asyncio.wait_for(asyncio.create_task(run_invoke(worker, client, refused)), 30)
    assert outcome == "stream refused"
    await until_idle(server, 5)


async def test_a_drain_lets_invokes_finish_and_an_unload_cuts_them(
    worker: RuntimeWorker,
    node: tuple[StandIn, ProtocolClient],
    llama_server: Path,
    instruct_model: Path,
) -> None:
    stand, client = node
    deployment_id = await loaded(worker, llama_server, instruct_model)
    deployed = worker.deployments[deployment_id]
    slot = deployed.slot
    # The API keeps the first invoke's request open after its body: in flight until then.
    stand.hold.clear()
    first = invoke(deployment_id, max_tokens=4, stream=True)
    running = asyncio.create_task(run_invoke(worker, client, first))
    await until(lambda: stand.of(first.invoke_id), 30, "the first answer")
    await asyncio.wait_for(stand.of(first.invoke_id)[0].ended.wait(), 30)
    assert deployed.in_flight == 1

    reports = Reports()
    drain = DeploymentJob(
        target_claim(JobKind.DEPLOYMENT_DRAIN, deployment_id, deadline_s=60, renew_within_s=0.4),
        reports,
        worker,
    )
    draining = asyncio.create_task(drain.run())
    await until(lambda: deployed.draining, 5, "the drain's start")
    assert worker.inventory().deployments[0].state == "draining"
    late = invoke(deployment_id)
    assert await asyncio.create_task(run_invoke(worker, client, late)) == (
        "refused deployment_draining"
    )
    await until(lambda: any(r.phase == "draining" for r in reports.progress_reports), 5,
                "a progress report while draining")  # fmt: skip
    assert not draining.done()
    stand.hold.set()
    assert await asyncio.wait_for(running, 10) == "relayed"
    assert await asyncio.wait_for(draining, 30) == "completed"
    [done] = reports.completed
    assert isinstance(done, DrainComplete) and (done.finished, done.cut) == (1, 0)
    assert done.settle_s is not None
    assert slot.pinned is None and slot.server is None
    assert worker.deployments == {} and worker.inventory().deployments == []

    # Loaded again; an unload with a deadline of 0 cuts a stream under way.
    deployment_id = await loaded(worker, llama_server, instruct_model)
    long = invoke(deployment_id, messages=STORY, max_tokens=2000, stream=True, temperature=1.0)
    cut = asyncio.create_task(run_invoke(worker, client, long))
    await until(lambda: stand.of(long.invoke_id), 30, "the long answer")
    await asyncio.wait_for(stand.of(long.invoke_id)[0].arrived.wait(), 30)
    unloading = Reports()
    unload = target_claim(JobKind.DEPLOYMENT_UNLOAD, deployment_id)
    assert await DeploymentJob(unload, unloading, worker).run() == "completed"
    [unloaded] = unloading.completed
    assert isinstance(unloaded, UnloadComplete) and (unloaded.unloaded, unloaded.cut) == (True, 1)
    assert await asyncio.wait_for(cut, 10) == "relayed"
    body = stand.of(long.invoke_id)[0].body
    assert body.endswith(STREAM_FAILED) and DONE not in body
    assert slot.pinned is None and slot.server is None

    again = Reports()
    assert await DeploymentJob(unload, again, worker).run() == "completed"
    assert again.completed[0].unloaded is False
