"""The runtime worker's report stream against the real API: sequences that survive a
restart (reserved in blocks in the run dir) and an upgrade in place (the earlier
sequence file), and the publisher's replay rule (agent/sequencing.py): the catch-up when
the run dir was lost and the control plane has seen further (the replay's cursor), a
replay answered without that cursor, and any other 409, which is final."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agent.client import ProtocolClient
from agent.runtime.config import RuntimeConfig
from agent.runtime.control import ControlPlane, runtime_sequences
from agent.runtime.worker import RuntimeWorker
from agent.sequencing import UNKNOWN_CURSOR_SKIP
from schemas.protocol import RUNTIME, StreamName
from schemas.runtime import EnvironmentReport
from tests.agent.proxy import FaultProxy, Scripted
from tests.api_server import RunningApi
from tests.flows import EnrolledNode, enroll
from tests.runtime_flows import BINARY_SHA256

ENVIRONMENT = EnvironmentReport(binary_sha256=BINARY_SHA256, version="b1", backend="cpu")


@pytest.mark.fast
def test_sequences_never_repeat_across_restarts(tmp_path: Path) -> None:
    stream = StreamName.RUNTIME
    first = runtime_sequences(tmp_path)
    taken = [first.take(stream) for _ in range(3)]
    assert taken == [1, 2, 3]
    # A crash now: the next run starts past the whole reserved block.
    again = runtime_sequences(tmp_path)
    assert again.take(stream) > 3
    again.advance_past(stream, 10_000)
    assert again.take(stream) == 10_001
    assert runtime_sequences(tmp_path).take(stream) > 10_001


@pytest.mark.fast
def test_an_unreadable_cursor_file_starts_the_stream_over(tmp_path: Path) -> None:
    """As a lost run dir does: the server's replay answer moves it past (below)."""
    (tmp_path / "runtime.cursors.json").write_text("{not json")
    assert runtime_sequences(tmp_path).take(StreamName.RUNTIME) == 1


def plane(
    api: RunningApi | FaultProxy, node_id: str, credential: str, run_dir: Path
) -> ControlPlane:
    binary = run_dir / "llama-server"
    run_dir.mkdir(parents=True, exist_ok=True)
    binary.write_bytes(b"not run here")
    config = RuntimeConfig(llama_server_path=binary, run_dir=run_dir)
    worker = RuntimeWorker(config)
    base_url = api.base_url if isinstance(api, RunningApi) else api.url
    http = httpx.AsyncClient(base_url=base_url, timeout=10)
    client = ProtocolClient(http, credential)
    return ControlPlane(worker, client, uuid.UUID(node_id), ENVIRONMENT)


async def test_a_lost_run_dir_catches_up_with_the_stream(api: RunningApi, tmp_path: Path) -> None:
    with api.client() as client:
        node = enroll(client, api)
    before = plane(api, node.node_id, node.credential, tmp_path / "a")
    for _ in range(3):
        assert await before.send_report()
    # A new run dir: its sequences start at 1 again, which the stream has seen.
    after = plane(api, node.node_id, node.credential, tmp_path / "b")
    assert await after.send_report(), "caught up past the server's cursor at once"
    assert await after.send_report()
    for used in (before, after):
        await used.client.http.aclose()
    with api.client() as client:
        view = client.get(
            f"/api/v1/admin/hardware/nodes/{node.node_id}/runtime", headers=api.admin_headers
        ).json()
    assert view["reported"] is True
    assert view["environments"] == [ENVIRONMENT.model_dump(mode="json")]


@pytest.fixture
def proxy(api: RunningApi) -> Iterator[FaultProxy]:
    """The real API behind a proxy that can answer a scripted 409 for one request."""
    made = FaultProxy(api.base_url).start()
    yield made
    made.close()


@pytest.fixture
def node(api: RunningApi) -> EnrolledNode:
    with api.client() as client:
        return enroll(client, api)


def sent(proxy: FaultProxy) -> list[int | None]:
    return [seen.sequence for seen in proxy.requests_to(RUNTIME)]


async def test_a_replay_without_the_servers_cursor_skips_ahead_and_sends_again(
    node: EnrolledNode, proxy: FaultProxy, tmp_path: Path
) -> None:
    worker = plane(proxy, node.node_id, node.credential, tmp_path / "run")
    assert await worker.send_report()
    # Something between the worker and the API dropped the cursor from the answer.
    proxy.script(RUNTIME, Scripted(409, "sequence_replayed"))
    assert await worker.send_report(), "sent again past a skip, as the publisher does"
    first, replayed, resent = sent(proxy)
    assert first is not None and replayed is not None and resent is not None
    assert replayed == first + 1
    assert resent == replayed + UNKNOWN_CURSOR_SKIP + 1
    await worker.client.http.aclose()


async def test_a_conflict_other_than_a_replay_is_final(
    node: EnrolledNode, proxy: FaultProxy, tmp_path: Path
) -> None:
    worker = plane(proxy, node.node_id, node.credential, tmp_path / "run")
    # A cursor in a 409 that is not a replay says nothing about the stream.
    proxy.script(RUNTIME, Scripted(409, "state_conflict", extra={"cursor": 5000}))
    assert not await worker.send_report(), "final for that report: not sent again"
    assert len(sent(proxy)) == 1
    assert await worker.send_report()
    refused, accepted = sent(proxy)
    assert refused is not None and accepted == refused + 1, "the cursor did not move"
    await worker.client.http.aclose()


async def test_a_worker_upgraded_in_place_keeps_its_cursor(
    node: EnrolledNode, proxy: FaultProxy, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # What the earlier worker left: the end of its reserved block, one number a line.
    (run_dir / "runtime.sequence").write_text("500\n")
    worker = plane(proxy, node.node_id, node.credential, run_dir)
    assert await worker.send_report()
    assert sent(proxy) == [501], "it resumed past everything the earlier version reserved"
    await worker.client.http.aclose()
    again = plane(proxy, node.node_id, node.credential, run_dir)
    assert await again.send_report()
    later = sent(proxy)[-1]
    assert later is not None and later > 501, "and a restart after the upgrade still does"
    await again.client.http.aclose()
