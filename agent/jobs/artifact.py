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
import errno
import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from agent.jobs.dispatch import Executor
from agent.jobs.lanes import Lanes
from agent.jobs.lease import Failed, LeasedJob, Reports
from agent.jobs.paths import (
    PathNotAllowed,
    allowed_root,
    artifact_dir,
    inside,
    no_symlinks_below,
    staging_dir,
)
from agent.jobs.reports import FamilyReports
from agent.jobs.staging import Staged, present, promote
from agent.sources.hub import Download, HubSource, SourceFailed
from schemas.artifacts import (
    ArtifactClaim,
    ArtifactFile,
    CompleteReport,
    FileProgress,
    ProgressReport,
)
from schemas.jobs import (
    FailAnswer,
    FailReport,
    FailureCode,
    JobKind,
    JobState,
    LeaseFence,
)

logger = logging.getLogger("modelforge.agent.jobs")


@dataclass(frozen=True)
class ArtifactSettings:
    roots: list[str]
    stall_s: float = 30.0
    progress_interval_s: float = 2.0
    chunk_bytes: int = 1 << 20
    # Received bytes go to disk and to the digest in blocks of this size, each in its
    # own worker thread while the next blocks arrive (agent/jobs/lanes.py).
    block_bytes: int = 1 << 20
    # Free space is checked again after every this many bytes written.
    reserve_check_bytes: int = 64 << 20


@dataclass(frozen=True)
class ArtifactContext:
    """What every artifact kind's executor is given beside its claim and reports
    (agent/jobs/dispatch.py: FamilyJobs)."""

    source: HubSource
    settings: ArtifactSettings


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


def artifact_fail_report(fence: LeaseFence, failure: Failed) -> FailReport:
    """The fail report of every artifact kind (an acquisition's, an eviction's): the
    failure's typed code under the job's fence."""
    return FailReport(
        lease=fence,
        code=FailureCode(failure.code),
        retryable=failure.retryable,
        detail=failure.detail,
    )


class ArtifactJob(LeasedJob[ProgressReport, CompleteReport, FailReport]):
    cancelled_code = FailureCode.CANCELLED
    internal_code = FailureCode.INTERNAL

    def __init__(
        self,
        claim: ArtifactClaim,
        reports: Reports[ProgressReport, CompleteReport, FailReport],
        source: HubSource,
        settings: ArtifactSettings,
    ) -> None:
        self.claim = claim
        self.spec = claim.spec
        self.source = source
        self.settings = settings
        self.progress = Progress({f.path: f.size for f in self.spec.files})
        super().__init__(
            claim.job_id,
            claim.lease,
            reports,
            name=f"job {claim.job_id} ({self.spec.repository}@{self.spec.commit[:12]})",
            report_every_s=settings.progress_interval_s,
        )

    async def work(self) -> CompleteReport:
        await self._acquire()
        return CompleteReport(lease=self.fence, files=list(self.spec.files))

    # ------------------------------------------------------------------ the work

    async def _acquire(self) -> None:
        try:
            root = allowed_root(self.spec.target_root, self.settings.roots)
            final = artifact_dir(root, self.spec.repository, self.spec.commit)
            staging = staging_dir(root, self.claim.job_id)
            no_symlinks_below(root, final)
            no_symlinks_below(root, staging)
        except PathNotAllowed as exc:
            raise Failed(FailureCode.PATH_NOT_ALLOWED, str(exc), retryable=False) from None
        if not root.is_dir():
            raise Failed(
                FailureCode.PATH_NOT_ALLOWED, "the target root does not exist", retryable=False
            )
        pending: list[tuple[ArtifactFile, Path, Path]] = []
        for file in self.spec.files:
            try:
                target, staged = inside(final, file.path), inside(staging, file.path)
                no_symlinks_below(root, target)
                no_symlinks_below(root, staged)
            except PathNotAllowed as exc:
                raise Failed(FailureCode.PATH_NOT_ALLOWED, str(exc), retryable=False) from None
            if await self._already_there(target, file):
                self.progress.set(file.path, file.size)
                continue
            pending.append((file, target, staged))
        self._check_reserve(root, sum(f.size - self._staged(s, f) for f, _, s in pending))
        for file, _, staged in pending:
            await self._fetch(root, file, staged, pending)
        # Metadata changes can wait on the filesystem's journal: not on the event loop.
        await asyncio.to_thread(self._promote, [(target, staged) for _, target, staged in pending])

    def _promote(self, moves: list[tuple[Path, Path]]) -> None:
        promote(moves)
        self._remove_staging()

    async def _already_there(self, target: Path, file: ArtifactFile) -> bool:
        return await asyncio.to_thread(present, target, file, self.settings.chunk_bytes)

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
                f"{free} bytes free, {remaining} still to write, "
                f"{self.spec.reserve.min_free_bytes} must stay free",
                retryable=False,
            )

    async def _fetch(
        self,
        root: Path,
        file: ArtifactFile,
        staged_path: Path,
        pending: list[tuple[ArtifactFile, Path, Path]],
    ) -> None:
        staged = Staged(staged_path, file)
        try:
            have = await asyncio.to_thread(staged.resume)
        except OSError as exc:
            raise staging_failure(file, exc) from None
        if have == file.size:
            # Staged in full by an earlier attempt: nothing to ask the source for.
            if staged.verified():
                self.progress.set(file.path, have)
                return
            await asyncio.to_thread(staged.discard)
            have = 0
        self.progress.set(file.path, have)
        # The lanes' threads start while the request is on its way.
        lanes = Lanes(staged.write, staged.digest)
        try:
            try:
                async with self.source.open(
                    self.spec.repository, self.spec.commit, file.path, have
                ) as download:
                    have = download.offset  # 0 when the source sent the whole file
                    staged.begin(have)
                    have = await self._stream(root, staged, download, have, pending, lanes)
            except BaseException:
                # Never close the file under a write still running in its thread.
                with contextlib.suppress(Exception):
                    await lanes.close(then=staged.close)
                raise
            await lanes.close(then=staged.close)  # a lane's error (a write's) is raised
        except SourceFailed as failure:
            if failure.code is FailureCode.SIZE_MISMATCH:
                staged.discard()  # a stale staged part: start it over next time
            raise Failed(failure.code, failure.detail, retryable=failure.retryable) from None
        except OSError as exc:  # the staged file could not be written
            raise staging_failure(file, exc) from None
        self.check()
        if have != file.size:
            staged.discard()
            raise Failed(
                FailureCode.SIZE_MISMATCH,
                f"{file.path}: {have} bytes, expected {file.size}",
                retryable=False,
            )
        if not staged.verified():
            staged.discard()
            raise Failed(
                FailureCode.CHECKSUM_MISMATCH, f"{file.path}: digest differs", retryable=False
            )

    async def _stream(
        self,
        root: Path,
        staged: Staged,
        download: Download,
        have: int,
        pending: list[tuple[ArtifactFile, Path, Path]],
        lanes: Lanes,
    ) -> int:
        """Receive on the event loop while the lanes' threads write and hash the blocks
        before (agent/jobs/lanes.py); the bytes received in the end (all handed to the
        lanes, which the caller closes)."""
        file = staged.file
        # A block is the chunks as received (no copy into one buffer).
        block: list[bytes] = []
        block_size = 0
        since_check = 0
        handed = time.monotonic()
        async for chunk in download.chunks:
            self.check()
            have += len(chunk)
            if have > file.size:
                raise Failed(
                    FailureCode.SIZE_MISMATCH,
                    f"{file.path}: longer than expected",
                    retryable=False,
                )
            block.append(chunk)
            block_size += len(chunk)
            self.progress.set(file.path, have)
            now = time.monotonic()
            # A slow source's bytes go to disk soon too: a restart resumes from them.
            if block_size < self.settings.block_bytes and now < handed + 0.25:
                continue
            handed = now
            await lanes.put(block)
            since_check += block_size
            block, block_size = [], 0
            if since_check >= self.settings.reserve_check_bytes:
                since_check = 0
                self._check_reserve(root, self._remaining(pending))
        if block:
            await lanes.put(block)
        return have

    def _remaining(self, pending: list[tuple[ArtifactFile, Path, Path]]) -> int:
        return sum(f.size - self.progress.done.get(f.path, 0) for f, _, _ in pending)

    def _remove_staging(self) -> None:
        with contextlib.suppress(PathNotAllowed, OSError):
            root = allowed_root(self.spec.target_root, self.settings.roots)
            shutil.rmtree(staging_dir(root, self.claim.job_id), ignore_errors=True)

    # -------------------------------------------------------------- the reports

    def progress_report(self) -> ProgressReport:
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
        return self.progress.report(self.fence)

    def fail_report(self, failure: Failed) -> FailReport:
        return artifact_fail_report(self.fence, failure)

    def on_failure(self, failure: Failed) -> None:
        if not failure.retryable:  # cancelled too: no attempt will resume the staging
            self._remove_staging()

    def on_fail_answer(self, answer: FailAnswer) -> None:
        if answer.state != JobState.QUEUED:
            # No attempt follows (the last one, or cancelled): nothing to resume.
            self._remove_staging()

    def on_lease_lost(self) -> None:
        logger.warning("%s: partial files kept for the next attempt", self.name)


def staging_failure(file: ArtifactFile, exc: OSError) -> Failed:
    """A staged file that could not be read or written, as the job's failure."""
    detail = f"{file.path}: {exc.strerror or type(exc).__name__}"
    if exc.errno == errno.ELOOP:
        # A symlink planted where the staged file is, since the paths were checked.
        return Failed(FailureCode.PATH_NOT_ALLOWED, detail, retryable=False)
    if exc.errno == errno.ENOSPC:
        return Failed(FailureCode.INSUFFICIENT_SPACE, detail, retryable=True)
    return Failed(FailureCode.INTERNAL, detail, retryable=True)


def _acquire(claim: ArtifactClaim, reports: FamilyReports, context: ArtifactContext) -> ArtifactJob:
    return ArtifactJob(claim, reports, context.source, context.settings)


# This module's kind, run by the agent's artifact-jobs loop (agent/runner.py).
EXECUTORS = (Executor(JobKind.ARTIFACT_ACQUIRE, ArtifactClaim, _acquire),)
