"""The download path at full speed, in this process against the real API and a real
Hub-layout server, with the agent's own HTTP session (agent/sources/hub.py): files of
many blocks and many reads, where one wrong byte anywhere must still fail the digest,
and a resume must verify the staged bytes as well as the new ones."""

from __future__ import annotations

from pathlib import Path

from agent.jobs.paths import artifact_dir, staging_dir
from tests.agent.claimed_jobs import one_file_job, running_job
from tests.api_server import ApiFactory, RunningApi
from tests.artifact_flows import content
from tests.flows import EnrolledNode
from tests.hub_server import HubServer

REPO = "acme/big-model"
COMMIT = "ffeeddccbbaa99887766554433221100ffeeddcc"
NAME = "weights/model.gguf"
# Many 1 MiB blocks, many reads; not a whole number of either.
DATA = content("big model", (24 << 20) + 4321)


def with_byte_flipped(data: bytes, at: int) -> bytes:
    changed = bytearray(data)
    changed[at] ^= 0x01
    return bytes(changed)


def setup(
    api_factory: ApiFactory, hub: HubServer, tmp_path: Path
) -> tuple[RunningApi, EnrolledNode, Path]:
    hub.state.add(REPO, "main", COMMIT, {NAME: DATA})
    root = tmp_path / "models"
    root.mkdir()
    api = api_factory(job_lease_s=30)
    node, _ = one_file_job(api, root, REPO, COMMIT, NAME, DATA, max_attempts=1)
    return api, node, root


async def test_a_large_file_is_fetched_whole_and_verified(
    api_factory: ApiFactory, hub: HubServer, tmp_path: Path
) -> None:
    api, node, root = setup(api_factory, hub, tmp_path)
    async with running_job(api, node, hub, root) as job:
        assert await job.run() == "completed"
    assert (artifact_dir(root, REPO, COMMIT) / NAME).read_bytes() == DATA


async def test_one_wrong_byte_in_the_middle_of_a_large_file_fails_the_digest(
    api_factory: ApiFactory, hub: HubServer, tmp_path: Path
) -> None:
    api, node, root = setup(api_factory, hub, tmp_path)
    hub.state.corrupt[NAME] = with_byte_flipped(DATA, len(DATA) // 2 + 777)
    async with running_job(api, node, hub, root) as job:
        assert await job.run() == "checksum_mismatch"
        staging = staging_dir(root, job.claim.job_id)
    assert not (artifact_dir(root, REPO, COMMIT) / NAME).exists()
    assert not staging.exists()


async def test_a_resume_continues_from_the_staged_bytes_and_verifies_the_whole_file(
    api_factory: ApiFactory, hub: HubServer, tmp_path: Path
) -> None:
    api, node, root = setup(api_factory, hub, tmp_path)
    staged_bytes = (5 << 20) + 12345
    async with running_job(api, node, hub, root) as job:
        staged = staging_dir(root, job.claim.job_id) / NAME
        staged.parent.mkdir(parents=True)
        staged.write_bytes(DATA[:staged_bytes])
        assert await job.run() == "completed"
    assert (artifact_dir(root, REPO, COMMIT) / NAME).read_bytes() == DATA
    assert hub.state.ranges == [(NAME, f"bytes={staged_bytes}-")]


async def test_a_wrong_byte_in_the_staged_part_fails_the_resumed_digest(
    api_factory: ApiFactory, hub: HubServer, tmp_path: Path
) -> None:
    """The digest covers the staged prefix, not only what the resume fetched."""
    api, node, root = setup(api_factory, hub, tmp_path)
    staged_bytes = (5 << 20) + 12345
    async with running_job(api, node, hub, root) as job:
        staged = staging_dir(root, job.claim.job_id) / NAME
        staged.parent.mkdir(parents=True)
        staged.write_bytes(with_byte_flipped(DATA, 1000)[:staged_bytes])
        assert await job.run() == "checksum_mismatch"
    assert hub.state.ranges == [(NAME, f"bytes={staged_bytes}-")]
    assert not (artifact_dir(root, REPO, COMMIT) / NAME).exists()


async def test_an_empty_file_is_staged_and_promoted_without_a_request(
    api_factory: ApiFactory, hub: HubServer, tmp_path: Path
) -> None:
    """It used to fail `internal`: nothing was staged, so there was nothing to rename."""
    hub.state.add(REPO, "main", COMMIT, {"__init__.py": b""})
    root = tmp_path / "models"
    root.mkdir()
    api = api_factory(job_lease_s=30)
    node, _ = one_file_job(api, root, REPO, COMMIT, "__init__.py", b"", max_attempts=1)
    async with running_job(api, node, hub, root) as job:
        assert await job.run() == "completed"
    assert (artifact_dir(root, REPO, COMMIT) / "__init__.py").read_bytes() == b""
    assert hub.state.ranges == []
