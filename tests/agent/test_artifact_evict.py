"""Artifact evictions end to end: a real agent process acquires an artifact from the test
hub (tests/hub_server.py), then evicts it through the real API and PostgreSQL: it
deletes only files it verified, only under its root, never through a symlink, and the
artifact leaves the node's inventory with its event; observed as an operator would."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from schemas.protocol import AUDIT, NODES
from tests.agent.artifact_agent import StartAgent, created, ended, start_agent
from tests.agent.harness import admin
from tests.api_server import RunningApi
from tests.artifact_flows import content, file_entry
from tests.hub_server import HubServer

ApiFactory = Callable[..., RunningApi]

REPO, COMMIT = "acme/evict-me", "aabbccddeeff00112233445566778899aabbccdd"
MODEL = "weights/model.gguf"
SIZES = {"config.json": 200, MODEL: 50_000}
FILES = {path: content(f"evict/{path}", size) for path, size in SIZES.items()}


@dataclass(frozen=True)
class Acquired:
    """A real agent that acquired the artifact: the API, the node, the artifact's
    directory under the agent's root."""

    api: RunningApi
    node_id: str
    place: Path

    def evicted(self) -> dict[str, Any]:
        """The eviction of the artifact, once it ended."""
        with self.api.client() as client:
            response = client.post(
                f"{NODES}/{self.node_id}/artifacts/evict",
                json={"repository": REPO, "commit": COMMIT},
                headers=self.api.admin_headers,
            )
        assert response.status_code == 201, response.text
        assert response.json()["kind"] == "artifact.evict.v1"
        return ended(self.api, response.json()["id"])

    def held(self) -> list[str]:
        """The node's inventory, as the admin API shows it."""
        items = admin(self.api, "GET", f"{NODES}/{self.node_id}/artifacts")["items"]
        return [f"{item['repository']}@{item['commit']}" for item in items]

    def acquire(self) -> str:
        files = [file_entry(path, data) for path, data in FILES.items()]
        manifest = {"repository": REPO, "commit": COMMIT, "files": files}
        root = self.place.parents[2]  # {root}/{owner}/{name}/{commit}
        body = {"node_id": self.node_id, "target_root": str(root), "manifest": manifest}
        return str(ended(self.api, created(self.api, body)["id"])["state"])


@pytest.fixture
def acquired(
    api_factory: ApiFactory, agents: StartAgent, hub: HubServer, tmp_path: Path
) -> Acquired:
    api = api_factory(job_lease_s=5, job_retry_base_s=0.2)
    hub.state.add(REPO, "main", COMMIT, FILES)
    _, node_id, root = start_agent(api, agents, hub, tmp_path)
    artifact = Acquired(api, node_id, root / REPO / COMMIT)
    assert artifact.acquire() == "succeeded"
    return artifact


def test_an_artifact_is_verified_deleted_and_leaves_the_inventory(acquired: Acquired) -> None:
    place = acquired.place
    # Not the artifact's: kept, and so is its directory.
    (place / "weights" / "notes.txt").write_text("mine")
    job = acquired.evicted()
    assert job["state"] == "succeeded", job
    assert not (place / "config.json").exists() and not (place / MODEL).exists()
    assert (place / "weights" / "notes.txt").read_text() == "mine"
    assert acquired.held() == []
    acquired.api.settle()
    audit = admin(acquired.api, "GET", AUDIT, params={"target_id": job["id"]})["items"]
    assert [row["action"] for row in reversed(audit)][-1] == "job.completed"
    # Emptied directories go, up to the commit's.
    (place / "weights" / "notes.txt").unlink()
    assert acquired.acquire() == "succeeded"
    assert acquired.evicted()["state"] == "succeeded"
    assert not place.exists() and place.parent.is_dir()


def test_a_symlink_planted_where_the_file_was_fails_typed_and_deletes_nothing(
    acquired: Acquired, tmp_path: Path
) -> None:
    # The same bytes outside the root: a digest read through the link would match.
    precious = tmp_path / "precious.gguf"
    precious.write_bytes(FILES[MODEL])
    planted = acquired.place / MODEL
    planted.unlink()
    planted.symlink_to(precious)
    failed = acquired.evicted()
    assert failed["state"] == "failed", failed
    assert failed["failure"]["code"] == "path_not_allowed" and not failed["failure"]["retryable"]
    assert precious.read_bytes() == FILES[MODEL]
    assert planted.is_symlink() and (acquired.place / "config.json").exists(), "nothing deleted"
    assert acquired.held() == [f"{REPO}@{COMMIT}"]


def test_a_symlinked_directory_on_the_path_is_never_followed(
    acquired: Acquired, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    os.rename(acquired.place / "weights", elsewhere)
    (acquired.place / "weights").symlink_to(elsewhere, target_is_directory=True)
    assert acquired.evicted()["failure"]["code"] == "path_not_allowed"
    assert (elsewhere / "model.gguf").read_bytes() == FILES[MODEL]
    assert (acquired.place / "config.json").exists()


def test_a_file_that_changed_is_not_deleted(acquired: Acquired) -> None:
    changed = bytearray(FILES[MODEL])
    changed[100] ^= 0xFF
    (acquired.place / MODEL).write_bytes(bytes(changed))
    assert acquired.evicted()["failure"]["code"] == "checksum_mismatch"
    assert (acquired.place / MODEL).read_bytes() == bytes(changed)
    assert (acquired.place / "config.json").exists(), "all or nothing: the verified one stays"
    assert acquired.held() == [f"{REPO}@{COMMIT}"]
