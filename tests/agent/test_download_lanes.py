"""The staged file's writes and the worker lanes behind a download, on their own: a short
write is carried on where it stopped, and a lane's failure reaches the loop."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from agent.jobs.artifact import staging_failure
from agent.jobs.lanes import Lanes
from agent.jobs.staging import Staged
from schemas.artifacts import ArtifactFile
from schemas.jobs import FailureCode
from tests.artifact_flows import content, file_entry

pytestmark = pytest.mark.fast


def staged_file(tmp_path: Path, data: bytes) -> Staged:
    return Staged(tmp_path / "part", ArtifactFile.model_validate(file_entry("part", data)))


def test_short_writes_are_carried_on_where_they_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = content("short writes", 3 << 20)
    chunks = [data[i : i + 300_001] for i in range(0, len(data), 300_001)]
    writev = os.writev
    calls = 0

    def short(fd: int, buffers: list[bytes]) -> int:
        nonlocal calls
        calls += 1
        if calls > 1_000:  # a write that does not move on would fill the disk
            raise AssertionError("the writes do not move on")
        # At most 70,000 bytes a call, ending inside a chunk more often than not.
        taken, budget = [], 70_000
        for buffer in buffers:
            taken.append(memoryview(buffer)[:budget])
            budget -= len(taken[-1])
            if not budget:
                break
        return writev(fd, taken)

    monkeypatch.setattr(os, "writev", short)
    staged = staged_file(tmp_path, data)
    staged.begin(0)
    for first in range(0, len(chunks), 4):
        block = chunks[first : first + 4]
        staged.write(block)
        staged.digest(block)
    staged.close()
    assert calls > len(data) // 70_000
    assert staged.path.read_bytes() == data
    assert staged.verified()


def test_a_resume_writes_after_the_staged_part_and_drops_what_followed_it(
    tmp_path: Path,
) -> None:
    data = content("resumed", 1 << 20)
    staged = staged_file(tmp_path, data)
    staged.path.write_bytes(data[:1000] + b"stale bytes past the offset")
    staged.begin(1000)
    staged.write([data[1000:]])
    staged.close()
    assert staged.path.read_bytes() == data


def test_a_start_over_replaces_the_staged_part(tmp_path: Path) -> None:
    """offset 0 (the source ignored the Range): a new file, none of the old bytes."""
    data = content("started over", 100_000)
    staged = staged_file(tmp_path, data)
    staged.path.write_bytes(b"an earlier attempt's bytes " * 10_000)
    staged.begin(0)
    staged.write([data])
    staged.digest([data])
    staged.close()
    assert staged.path.read_bytes() == data
    assert staged.verified()


async def test_every_block_reaches_every_lane_in_order() -> None:
    seen: list[list[bytes]] = [[], []]
    lanes = Lanes(seen[0].extend, seen[1].extend, depth=2)
    blocks = [[os.urandom(1000), os.urandom(10)] for _ in range(50)]
    for block in blocks:
        await lanes.put(block)
    await lanes.close()
    flat = [chunk for block in blocks for chunk in block]
    assert seen == [flat, flat]


async def test_a_lane_that_fails_stops_the_download_with_its_error() -> None:
    digest = hashlib.sha256()

    def full_disk(block: list[bytes]) -> None:
        raise OSError(28, "No space left on device")

    def hashed(block: list[bytes]) -> None:
        for chunk in block:
            digest.update(chunk)

    lanes = Lanes(full_disk, hashed, depth=2)
    with pytest.raises(OSError, match="No space left"):
        for _ in range(100):
            await lanes.put([b"x" * 1000])
        await lanes.close()
    with pytest.raises(OSError, match="No space left"):
        await lanes.close()


def test_a_symlink_planted_as_the_staged_part_is_neither_read_nor_written_through(
    tmp_path: Path,
) -> None:
    """The paths are checked for symlinks before the job; one planted since is refused
    at the open (O_NOFOLLOW), as a path the job may not use, never retried."""
    data = content("planted", 10_000)
    outside = tmp_path / "outside"
    outside.write_bytes(b"not the agent's" * 100)
    staged = staged_file(tmp_path, data)
    staged.path.symlink_to(outside)
    with pytest.raises(OSError) as read:
        staged.resume()
    staged.begin(500)
    with pytest.raises(OSError) as written:
        staged.write([data[500:]])
    assert outside.read_bytes() == b"not the agent's" * 100
    for raised in (read.value, written.value):
        failure = staging_failure(staged.file, raised)
        assert failure.code == FailureCode.PATH_NOT_ALLOWED and not failure.retryable
