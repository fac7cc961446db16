"""The runtime worker's report stream against the real API: sequences that survive a
restart (reserved in blocks in the run dir), and the catch-up when the run dir was lost
and the control plane has seen further (the replay's cursor)."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest

from agent.client import ProtocolClient
from agent.runtime.config import RuntimeConfig
from agent.runtime.control import SEQUENCE_BLOCK, ControlPlane, SequenceFile
from agent.runtime.worker import RuntimeWorker
from schemas.runtime import EnvironmentReport
from tests.api_server import RunningApi
from tests.flows import enroll
from tests.runtime_flows import BINARY_SHA256

ENVIRONMENT = EnvironmentReport(binary_sha256=BINARY_SHA256, version="b1", backend="cpu")


@pytest.mark.fast
def test_sequences_never_repeat_across_restarts(tmp_path: Path) -> None:
    path = tmp_path / "runtime.sequence"
    first = SequenceFile(path)
    taken = [first.take() for _ in range(3)]
    assert taken == [1, 2, 3]
    # A crash now: the next run starts past the whole reserved block.
    again = SequenceFile(path)
    assert again.take() == SEQUENCE_BLOCK + 1
    again.advance_past(10_000)
    assert again.take() == 10_001
    assert SequenceFile(path).take() > 10_001


def plane(api: RunningApi, node_id: str, credential: str, run_dir: Path) -> ControlPlane:
    binary = run_dir / "llama-server"
    run_dir.mkdir(parents=True)
    binary.write_bytes(b"not run here")
    config = RuntimeConfig(llama_server_path=binary, run_dir=run_dir)
    worker = RuntimeWorker(config)
    http = httpx.AsyncClient(base_url=api.base_url, timeout=10)
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
