"""One artifact acquisition job on the node: check the root and the reserve, fetch each
file into staging with resume, verify it while streaming, promote by rename, report.

* **Staging** is `{root}/.modelforge-staging/{job_id}/`, on the root's filesystem, kept
  across attempts of the same job: after a crash or a lost lease the next attempt
  resumes each partial file with an HTTP Range request (re-reading only the staged
  prefix into the digest), or starts the file over when the source ignores the Range.
* **Verification** costs no second read: the digest of whichever kind the job holds
  (SHA-256, or the git blob id of a small file) is computed as the bytes arrive.
* **Promotion** renames each verified file into `{root}/{repository}/{commit}/…`. A file
  already there with the right digest is not downloaded again.
* **Reserve**: the free space after the remaining bytes must stay above the job's
  `min_free_bytes`, checked before and during the download.
* **Stalls**: no bytes for `stall_s` fails the attempt as `stalled` (retryable); a slow
  but moving download never does.
* **Progress** goes to the control plane and to the log at most every
  `progress_interval_s`; its answer carries the operator's cancel, after which the
  staging files are removed and the job reported `cancelled`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol

from agent.errors import RequestFailed, Transient
from agent.jobs.paths import (
    PathNotAllowed,
    allowed_root,
    artifact_dir,
    inside,
    no_symlinks_below,
    staging_dir,
)
from agent.sources.hub import HubSource, SourceFailed
from schemas.artifacts import (
    ArtifactClaim,
    ArtifactFile,
    CompleteAnswer,
    CompleteReport,
    DigestAlgorithm,
    FileDigest,
    FileProgress,
    ProgressReport,
)
from schemas.jobs import (
    FailAnswer,
    FailReport,
    FailureCode,
    JobState,
    LeaseFence,
    ProgressAnswer,
)

logger = logging.getLogger("modelforge.agent.jobs")


@dataclass(frozen=True)
class ArtifactSettings:
    roots: list[str]
    stall_s: float = 30.0
    progress_interval_s: float = 2.0
    chunk_bytes: int = 1 << 20
    # Free space is checked again after every this many bytes written.
    reserve_check_bytes: int = 64 << 20


class JobReports(Protocol):
    """The control plane's side of a job (agent/client.py: ProtocolClient)."""

    async def artifact_progress(
        self, job_id: uuid.UUID, report: ProgressReport
    ) -> ProgressAnswer: ...
    async def complete_artifact_job(
        self, job_id: uuid.UUID, report: CompleteReport
    ) -> CompleteAnswer: ...
    async def fail_artifact_job(self, job_id: uuid.UUID, report: FailReport) -> FailAnswer: ...


class Failed(Exception):
    def __init__(self, code: FailureCode, retryable: bool, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.retryable = retryable
        self.detail = detail


class Cancelled(Exception):
    """The operator cancelled the job (the answer to a progress report said so)."""


class LeaseLost(Exception):
    """The control plane no longer takes reports under this lease: stop, keep partials."""


def new_digest(digest: FileDigest, size: int) -> hashlib._Hash:
    if digest.algorithm == DigestAlgorithm.SHA256:
        return hashlib.sha256()
    blob = hashlib.sha1(usedforsecurity=False)
    blob.update(b"blob %d\0" % size)
    return blob


def _hash_file(path: Path, digest: FileDigest, size: int, chunk: int) -> str:
    hasher = new_digest(digest, size)
    with path.open("rb") as handle:
        while block := handle.read(chunk):
            hasher.update(block)
    return hasher.hexdigest()


def _present(target: Path, file: ArtifactFile, chunk: int) -> bool:
    """Already promoted, with the right size and digest (then it is not fetched again)."""
    if not target.is_file() or target.stat().st_size != file.size:
        return False
    return _hash_file(target, file.digest, file.size, chunk) == file.digest.value


def _promote(moves: list[tuple[Path, Path]]) -> None:
    for target, staged in moves:
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staged, target)


class Staged:
    """A file's staged part: resumed from what is on disk, written chunk by chunk.
    Plain blocking file calls: local disk, one chunk at a time."""

    def __init__(self, path: Path, file: ArtifactFile) -> None:
        self.path = path
        self.file = file
        self._out: BinaryIO | None = None

    def resume(self) -> tuple[int, hashlib._Hash]:
        """Bytes already staged (at most the file's size) and the digest over them."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        hasher = new_digest(self.file.digest, self.file.size)
        try:
            have = min(self.path.stat().st_size, self.file.size)
        except FileNotFoundError:
            return 0, hasher
        with self.path.open("rb") as handle:
            remaining = have
            while remaining and (block := handle.read(min(remaining, 1 << 20))):
                hasher.update(block)
                remaining -= len(block)
        return have, hasher

    def begin(self, offset: int) -> None:
        self._out = self.path.open("r+b" if self.path.exists() else "wb")
        self._out.seek(offset)
        self._out.truncate()

    def write(self, chunk: bytes) -> None:
        assert self._out is not None
        self._out.write(chunk)

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None

    def discard(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


@dataclass
class Progress:
    """Bytes done per file, and a rate over the last report interval."""

    sizes: dict[str, int]
    done: dict[str, int] = field(default_factory=dict)
    _mark: tuple[float, int] = (0.0, 0)
    rate: float | None = None

    @property
    def total(self) -> int:
        return sum(self.sizes.values())

    @property
    def bytes_done(self) -> int:
        return sum(self.done.values())

    def set(self, path: str, done: int) -> None:
        self.done[path] = done

    def sample(self) -> None:
        now, done = time.monotonic(), self.bytes_done
        then, before = self._mark
        if then:
            self.rate = max(0.0, (done - before) / max(now - then, 1e-6))
        self._mark = (now, done)

    def report(self, fence: LeaseFence) -> ProgressReport:
        return ProgressReport(
            lease=fence,
            files=[FileProgress(path=p, bytes_done=d) for p, d in self.done.items()],
            bytes_per_s=self.rate,
        )


class ArtifactJob:
    def __init__(
        self,
        claim: ArtifactClaim,
        reports: JobReports,
        source: HubSource,
        settings: ArtifactSettings,
    ) -> None:
        self.claim = claim
        self.spec = claim.spec
        self.reports = reports
        self.source = source
        self.settings = settings
        self.fence = LeaseFence(lease_id=claim.lease.lease_id, epoch=claim.lease.epoch)
        self.progress = Progress({f.path: f.size for f in self.spec.files})
        self.cancelled = asyncio.Event()
        self.lost = asyncio.Event()
        self.name = f"job {claim.job_id} ({self.spec.repository}@{self.spec.commit[:12]})"

    async def run(self) -> str:
        """Do the job and report its end; the outcome as a word (for the log and tests)."""
        reporter = asyncio.create_task(self._report_progress())
        try:
            await self._acquire()
        except Cancelled:
            self._remove_staging()
            return await self._fail(Failed(FailureCode.CANCELLED, False, "cancelled"))
        except LeaseLost:
            logger.warning("%s: the lease was lost; stopping (partial files kept)", self.name)
            return "lease lost"
        except Failed as failure:
            if not failure.retryable:
                self._remove_staging()
            return await self._fail(failure)
        finally:
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporter
        return await self._complete()

    # ------------------------------------------------------------------ the work

    async def _acquire(self) -> None:
        try:
            root = allowed_root(self.spec.target_root, self.settings.roots)
            final = artifact_dir(root, self.spec.repository, self.spec.commit)
            staging = staging_dir(root, self.claim.job_id)
            no_symlinks_below(root, final)
            no_symlinks_below(root, staging)
        except PathNotAllowed as exc:
            raise Failed(FailureCode.PATH_NOT_ALLOWED, False, str(exc)) from None
        if not root.is_dir():
            raise Failed(FailureCode.PATH_NOT_ALLOWED, False, "the target root does not exist")
        pending: list[tuple[ArtifactFile, Path, Path]] = []
        for file in self.spec.files:
            try:
                target, staged = inside(final, file.path), inside(staging, file.path)
                no_symlinks_below(root, target)
                no_symlinks_below(root, staged)
            except PathNotAllowed as exc:
                raise Failed(FailureCode.PATH_NOT_ALLOWED, False, str(exc)) from None
            if await self._already_there(target, file):
                self.progress.set(file.path, file.size)
                continue
            pending.append((file, target, staged))
        self._check_reserve(root, sum(f.size - self._staged(s, f) for f, _, s in pending))
        for file, _, staged in pending:
            await self._fetch(root, file, staged, pending)
        _promote([(target, staged) for _, target, staged in pending])
        self._remove_staging()

    async def _already_there(self, target: Path, file: ArtifactFile) -> bool:
        return await asyncio.to_thread(_present, target, file, self.settings.chunk_bytes)

    @staticmethod
    def _staged(staged: Path, file: ArtifactFile) -> int:
        try:
            return min(staged.stat().st_size, file.size)
        except FileNotFoundError:
            return 0

    def _check_reserve(self, root: Path, remaining: int) -> None:
        free = shutil.disk_usage(root).free
        if free - remaining < self.spec.reserve.min_free_bytes:
            raise Failed(
                FailureCode.INSUFFICIENT_SPACE,
                False,
                f"{free} bytes free, {remaining} still to write, "
                f"{self.spec.reserve.min_free_bytes} must stay free",
            )

    async def _fetch(
        self,
        root: Path,
        file: ArtifactFile,
        staged_path: Path,
        pending: list[tuple[ArtifactFile, Path, Path]],
    ) -> None:
        staged = Staged(staged_path, file)
        have, hasher = await asyncio.to_thread(staged.resume)
        if have == file.size:
            # Staged in full by an earlier attempt: nothing to ask the source for.
            if hasher.hexdigest() == file.digest.value:
                self.progress.set(file.path, have)
                return
            staged.discard()
            have, hasher = 0, new_digest(file.digest, file.size)
        self.progress.set(file.path, have)
        since_check = 0
        try:
            async with self.source.open(
                self.spec.repository, self.spec.commit, file.path, have
            ) as download:
                if download.offset != have:  # the source sent the whole file
                    have, hasher = 0, new_digest(file.digest, file.size)
                staged.begin(have)
                try:
                    chunks = download.chunks.__aiter__()
                    while True:
                        self._raise_if_stopped()
                        try:
                            chunk = await asyncio.wait_for(
                                chunks.__anext__(), self.settings.stall_s
                            )
                        except StopAsyncIteration:
                            break
                        except TimeoutError:
                            raise Failed(
                                FailureCode.STALLED,
                                True,
                                f"{file.path}: no data for {self.settings.stall_s:g} s",
                            ) from None
                        have += len(chunk)
                        if have > file.size:
                            raise Failed(
                                FailureCode.SIZE_MISMATCH,
                                False,
                                f"{file.path}: longer than expected",
                            )
                        staged.write(chunk)
                        hasher.update(chunk)
                        self.progress.set(file.path, have)
                        since_check += len(chunk)
                        if since_check >= self.settings.reserve_check_bytes:
                            since_check = 0
                            self._check_reserve(root, self._remaining(pending))
                finally:
                    staged.close()
        except SourceFailed as failure:
            if failure.code is FailureCode.SIZE_MISMATCH:
                staged.discard()  # a stale staged part: start it over next time
            raise Failed(failure.code, failure.retryable, failure.detail) from None
        self._raise_if_stopped()
        if have != file.size:
            staged.discard()
            raise Failed(
                FailureCode.SIZE_MISMATCH, False, f"{file.path}: {have} bytes, expected {file.size}"
            )
        if hasher.hexdigest() != file.digest.value:
            staged.discard()
            raise Failed(FailureCode.CHECKSUM_MISMATCH, False, f"{file.path}: digest differs")

    def _remaining(self, pending: list[tuple[ArtifactFile, Path, Path]]) -> int:
        return sum(f.size - self.progress.done.get(f.path, 0) for f, _, _ in pending)

    def _raise_if_stopped(self) -> None:
        if self.cancelled.is_set():
            raise Cancelled
        if self.lost.is_set():
            raise LeaseLost

    def _remove_staging(self) -> None:
        with contextlib.suppress(PathNotAllowed, OSError):
            root = allowed_root(self.spec.target_root, self.settings.roots)
            shutil.rmtree(staging_dir(root, self.claim.job_id), ignore_errors=True)

    # -------------------------------------------------------------- the reports

    async def _report_progress(self) -> None:
        interval = min(self.settings.progress_interval_s, self.claim.lease.renew_within_s)
        while True:
            await asyncio.sleep(interval)
            self.progress.sample()
            rate = self.progress.rate
            eta = (self.progress.total - self.progress.bytes_done) / rate if rate else None
            logger.info(
                "%s: %d/%d bytes, %s, ETA %s",
                self.name,
                self.progress.bytes_done,
                self.progress.total,
                f"{rate / 1e6:.2f} MB/s" if rate is not None else "rate unknown",
                f"{eta:.0f} s" if eta is not None else "unknown",
            )
            try:
                answer = await self.reports.artifact_progress(
                    self.claim.job_id, self.progress.report(self.fence)
                )
            except Transient:
                continue  # the next report may get through before the lease ends
            except RequestFailed:
                # 409 (lease stale or expired, job ended), 401/403, 404: not ours now.
                self.lost.set()
                return
            if answer.cancel_requested:
                self.cancelled.set()

    async def _complete(self) -> str:
        report = CompleteReport(lease=self.fence, files=list(self.spec.files))
        try:
            await self.reports.complete_artifact_job(self.claim.job_id, report)
        except RequestFailed as exc:
            logger.warning("%s: the completion was not accepted (%s)", self.name, exc)
            return "completion refused"
        logger.info("%s: complete", self.name)
        return "completed"

    async def _fail(self, failure: Failed) -> str:
        logger.warning("%s: %s (%s)", self.name, failure.code.value, failure.detail)
        report = FailReport(
            lease=self.fence,
            code=failure.code,
            retryable=failure.retryable,
            detail=failure.detail[:500],
        )
        try:
            answer = await self.reports.fail_artifact_job(self.claim.job_id, report)
        except RequestFailed as exc:
            logger.warning("%s: the failure report was not accepted (%s)", self.name, exc)
            return failure.code.value
        if answer.state != JobState.QUEUED:
            # No attempt follows (the last one, or cancelled): nothing to resume.
            self._remove_staging()
        return failure.code.value
