"""Downstream consumers: the catalog, subject filters, `events tail` and the example consumer."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from schemas.catalog import render
from schemas.events import EventType, subject_filter
from stack.embedded_nats import EmbeddedNats
from tests.api_server import ApiFactory, RunningApi
from tests.flows import INVENTORY, enroll, gpu, inventory_body
from tests.pipeline import RunningPipeline

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def api(
    api_factory: ApiFactory, database_url: str, nats_server: EmbeddedNats, tmp_path: Path
) -> Iterator[RunningApi]:
    """With the workers' pipeline relaying to this test's own NATS, which it reads."""
    pipeline = RunningPipeline(database_url, tmp_path, nats_url=nats_server.url).start()
    running = api_factory(pipeline=False)
    running.pipeline = pipeline
    try:
        yield running
    finally:
        pipeline.stop()


@pytest.mark.fast
def test_committed_catalog_is_current() -> None:
    assert (ROOT / "docs" / "events.md").read_text() == render(), (
        "docs/events.md is stale; run `modelforge events catalog docs/events.md`"
    )


@pytest.mark.fast
def test_catalog_lists_every_event_type() -> None:
    text = render()
    for event_type in EventType:
        assert f"`{event_type.cloudevent_type}`" in text


@pytest.mark.fast
def test_subject_filters() -> None:
    node = "5b0c3f6e-0000-4000-8000-000000000001"
    assert subject_filter() == "modelforge.v1.>"
    assert subject_filter(node) == f"modelforge.v1.node.{node}.>"
    assert subject_filter(None, EventType.GPU_MISSING) == "modelforge.v1.node.*.gpu.missing"
    assert subject_filter(node, EventType.GPU_ADDED) == f"modelforge.v1.node.{node}.gpu.added"
    assert EventType.GPU_ADDED.subject(node) == subject_filter(node, EventType.GPU_ADDED)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not about a node"):
        subject_filter(node, EventType.TOKEN_CREATED)


def _tail(nats_url: str, *args: str) -> list[dict[str, object]]:
    result = subprocess.run(
        [sys.executable, "-m", "cli.main", "events", "tail", "--idle-exit", "2", *args],
        env={**os.environ, "MODELFORGE_NATS_URL": nats_url},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [json.loads(line) for line in result.stdout.splitlines()]


async def test_events_tail_filters_by_node_and_type(
    api: RunningApi, database_url: str, nats_server: EmbeddedNats
) -> None:
    with api.client() as client:
        first = enroll(client, api, hostname="first")
        second = enroll(client, api, hostname="second")
        for node in (first, second):
            body = inventory_body(node.node_id, 1, gpus=[gpu(0), gpu(1)])
            assert client.put(INVENTORY, json=body, headers=node.headers).status_code == 200
    await asyncio.to_thread(api.settle)

    everything = await asyncio.to_thread(_tail, nats_server.url, "--from-start")
    assert {e["type"] for e in everything} >= {
        "io.modelforge.token.created.v1",
        "io.modelforge.node.enrolled.v1",
        "io.modelforge.node.gpu.added.v1",
    }
    one_node = await asyncio.to_thread(
        _tail, nats_server.url, "--from-start", "--node", first.node_id
    )
    assert one_node and {e["nodeid"] for e in one_node} == {first.node_id}
    gpus = await asyncio.to_thread(
        _tail, nats_server.url, "--from-start", "--type", "node.gpu.added"
    )
    assert len(gpus) == 4
    assert {e["nodeid"] for e in gpus} == {first.node_id, second.node_id}
    limited = await asyncio.to_thread(_tail, nats_server.url, "--from-start", "--limit", "3")
    assert [e["id"] for e in limited] == [e["id"] for e in everything[:3]]
    # Without --from-start only new events are shown: none arrive, so nothing.
    assert await asyncio.to_thread(_tail, nats_server.url) == []


async def test_example_durable_consumer_resumes_where_it_left_off(
    api: RunningApi, database_url: str, nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    script = ROOT / "ops" / "examples" / "node_events_consumer.py"

    def run_consumer_until(expected: int) -> list[str]:
        process = subprocess.Popen(
            [
                sys.executable,
                str(script),
                "--nats-url",
                nats_server.url,
                "--name",
                "example",
                "--subject",
                "modelforge.v1.node.*.gpu.added",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        lines: list[str] = []
        try:
            assert process.stdout is not None
            while len(lines) < expected:
                line = process.stdout.readline()
                assert line, "consumer exited early"
                lines.append(line)
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=20)
        return lines

    with api.client() as client:
        node = enroll(client, api)
        body = inventory_body(node.node_id, 1, gpus=[gpu(0), gpu(1)])
        assert client.put(INVENTORY, json=body, headers=node.headers).status_code == 200
    await asyncio.to_thread(api.settle)
    first_run = await asyncio.to_thread(run_consumer_until, 2)
    assert all("gpu.added" in line for line in first_run)

    with api.client() as client:
        body = inventory_body(node.node_id, 2, gpus=[gpu(0), gpu(1), gpu(2)])
        assert client.put(INVENTORY, json=body, headers=node.headers).status_code == 200
    await asyncio.to_thread(api.settle)
    # The durable consumer acked the first two: a restart sees only the new GPUs.
    second_run = await asyncio.to_thread(run_consumer_until, 3)
    assert len(second_run) == 3
    assert not set(second_run) & set(first_run)
