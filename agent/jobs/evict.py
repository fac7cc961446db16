"""One artifact eviction on the node (artifact.evict.v1): delete an artifact's files from
one of the agent's roots, each only once verified against the lease, then report them
gone.

* **Where**: the root must be one of the agent's `artifact_roots` and every file inside
  `{root}/{repository}/{commit}/`, checked as an acquisition checks its paths
  (agent/jobs/paths.py), whatever the control plane sent.
* **Never through a symlink**: below the root, each directory is opened relative to its
  parent with O_NOFOLLOW | O_DIRECTORY and each file is looked at, opened and unlinked
  relative to its directory's descriptor, so a symlink (or anything that is not a
  directory or a regular file) planted anywhere on the path, the file's own place
  included, is never followed: the job fails `path_not_allowed` and deletes nothing;
  what the symlink points at is untouched.
* **Only what it verified**: every file is checked (its size, then its digest, read
  through the descriptor it will be deleted by) before the first is deleted; one that
  differs fails the job (`size_mismatch`, `checksum_mismatch`, final) and deletes
  nothing. A file is unlinked only while its name still holds the inode that was
  verified. A file already absent is gone already.
* **Then** the directories it emptied are removed up to the commit's (a file the
  artifact does not name keeps its directory), and the completion reports the lease's
  files as gone, for the control plane to take the artifact out of the node's inventory.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from agent.jobs.artifact import ArtifactContext, artifact_fail_report
from agent.jobs.dispatch import Executor
from agent.jobs.lease import Failed, LeasedJob
from agent.jobs.paths import PathNotAllowed, allowed_root, artifact_dir, inside, no_symlinks_below
from agent.jobs.reports import FamilyReports
from agent.jobs.staging import new_digest
from schemas.artifacts import ArtifactFile, EvictClaim, EvictReport, ProgressReport
from schemas.jobs import FailReport, FailureCode, JobKind

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
# NONBLOCK: opening what was planted there (a FIFO) must not wait for a writer.
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK


def _refused(detail: str) -> Failed:
    return Failed(FailureCode.PATH_NOT_ALLOWED, detail, retryable=False)


@dataclass(frozen=True)
class Verified:
    """A file that matched the lease: its directory's descriptor, its name there, and
    the inode that was read."""

    directory: int
    name: str
    inode: tuple[int, int]


class Tree:
    """The directories below the root, opened one component at a time, never through a
    symlink; closed together."""

    def __init__(self, root: Path) -> None:
        # The configured root itself is the operator's: it may be a symlink.
        self.root = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        self.opened: dict[tuple[str, ...], int] = {(): self.root}

    def directory(self, parts: tuple[str, ...]) -> int | None:
        """The directory at `parts` below the root; None when it does not exist."""
        if parts in self.opened:
            return self.opened[parts]
        parent = self.directory(parts[:-1])
        if parent is None:
            return None
        try:
            fd = os.open(parts[-1], _DIRECTORY, dir_fd=parent)
        except FileNotFoundError:
            return None
        except OSError as exc:  # ELOOP: a symlink; ENOTDIR: not a directory
            raise _refused(f"{'/'.join(parts)}: {exc.strerror}") from None
        self.opened[parts] = fd
        return fd

    def remove_empty(self, below: int) -> None:
        """Remove the opened directories that are now empty, deepest first, down to
        `below` components (the commit's directory's depth): never the root, never a
        directory the artifact was not in."""
        for parts in sorted(self.opened, key=len, reverse=True):
            if len(parts) < below:
                continue
            with contextlib.suppress(OSError):  # not empty: something else is in it
                os.rmdir(parts[-1], dir_fd=self.opened[parts[:-1]])

    def close(self) -> None:
        for fd in self.opened.values():
            os.close(fd)
        self.opened.clear()


class EvictJob(LeasedJob[ProgressReport, EvictReport, FailReport]):
    cancelled_code = FailureCode.CANCELLED
    internal_code = FailureCode.INTERNAL

    def __init__(self, claim: EvictClaim, reports: FamilyReports, context: ArtifactContext) -> None:
        self.spec = claim.spec
        self.settings = context.settings
        super().__init__(
            claim.job_id,
            claim.lease,
            reports,
            name=f"eviction {claim.job_id} ({self.spec.repository}@{self.spec.commit[:12]})",
            report_every_s=self.settings.progress_interval_s,
        )

    async def work(self) -> EvictReport:
        await asyncio.to_thread(self._evict)
        files = list(self.spec.files)
        return EvictReport(kind=JobKind.ARTIFACT_EVICT, lease=self.fence, files=files)

    def _evict(self) -> None:
        try:
            root = allowed_root(self.spec.target_root, self.settings.roots)
            final = artifact_dir(root, self.spec.repository, self.spec.commit)
            places = [inside(final, f.path).relative_to(root).parts for f in self.spec.files]
            for parts in places:
                no_symlinks_below(root, root.joinpath(*parts))
        except PathNotAllowed as exc:
            raise _refused(str(exc)) from None
        if not root.is_dir():
            raise _refused("the root does not exist")
        tree = Tree(root)
        try:
            verified = [
                found
                for file, parts in zip(self.spec.files, places, strict=True)
                if (found := self._verify(tree, file, parts)) is not None
            ]
            self.check()  # the last point at which a cancel leaves everything in place
            for found in verified:
                self._unlink(found)
            tree.remove_empty(below=len(final.relative_to(root).parts))
        finally:
            tree.close()

    def _verify(self, tree: Tree, file: ArtifactFile, parts: tuple[str, ...]) -> Verified | None:
        """The file, if it is there and matches the lease; None when it is gone already."""
        self.check()
        directory = tree.directory(parts[:-1])
        if directory is None:
            return None
        name = parts[-1]
        try:
            mode = os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(mode):
            raise _refused(f"{file.path}: not a regular file (a symlink?)")
        try:
            fd = os.open(name, _FILE, dir_fd=directory)
        except OSError as exc:  # replaced since the look: ELOOP for a symlink
            raise _refused(f"{file.path}: {exc.strerror}") from None
        try:
            facts = os.fstat(fd)
            if not stat.S_ISREG(facts.st_mode):
                raise _refused(f"{file.path}: not a regular file")
            if facts.st_size != file.size:
                raise Failed(
                    FailureCode.SIZE_MISMATCH,
                    f"{file.path}: {facts.st_size} bytes, expected {file.size}",
                    retryable=False,
                )
            if self._digest(fd, file) != file.digest.value:
                raise Failed(
                    FailureCode.CHECKSUM_MISMATCH, f"{file.path}: digest differs", retryable=False
                )
            return Verified(directory, name, (facts.st_dev, facts.st_ino))
        finally:
            os.close(fd)

    def _digest(self, fd: int, file: ArtifactFile) -> str:
        hasher = new_digest(file.digest, file.size)
        while block := os.read(fd, self.settings.chunk_bytes):
            hasher.update(block)
            self.check()
        return hasher.hexdigest()

    @staticmethod
    def _unlink(found: Verified) -> None:
        """Unlink the verified file, only while its name still holds that inode."""
        try:
            now = os.stat(found.name, dir_fd=found.directory, follow_symlinks=False)
        except FileNotFoundError:
            return
        if (now.st_dev, now.st_ino) != found.inode:
            raise _refused(f"{found.name}: replaced since it was verified")
        try:
            os.unlink(found.name, dir_fd=found.directory)
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise Failed(FailureCode.PATH_NOT_ALLOWED, str(exc), retryable=False) from None
            raise

    def progress_report(self) -> ProgressReport:
        # Only the lease is kept: an eviction has no bytes to count.
        return ProgressReport(lease=self.fence, files=[])

    def fail_report(self, failure: Failed) -> FailReport:
        return artifact_fail_report(self.fence, failure)


# This module's kind, run by the agent's artifact-jobs loop (agent/runner.py).
EXECUTORS = (Executor(JobKind.ARTIFACT_EVICT, EvictClaim, EvictJob),)
