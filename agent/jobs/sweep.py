"""Staging that no attempt will resume is removed: a job that ended while its agent was
down (cancelled, or its last lease expired) would otherwise keep its partial files in
`{root}/.modelforge-staging/{job_id}/` for good, eating into every later job's reserve.

The sweep runs in the job loop (agent/jobs/loop.py) when it starts and then at most
every `period_s`, always between two jobs: the staging of the job being run is never
looked at. For each staging dir it asks the control plane whether the job is still
live, with a progress report under a lease that no one holds (a fresh random lease id).
That report can never be accepted, so it extends nothing and changes nothing; the
refusal says what the job is, because the control plane checks in a fixed order
(store/leases.py: held):

* 404 `not_found` (no such job), 409 `job_finished`: nothing will resume it, so the
  staging goes;
* 403 `job_not_owned`: another node's job (two nodes may share a root): not this node's
  to judge, so only its age counts, as with no answer;
* 409 `lease_stale` or `lease_expired`: the job is queued for another attempt, or
  leased: kept, the next attempt resumes it;
* no answer (the control plane unreachable, the credential refused): kept, unless
  nothing in it changed for `max_age_s`, the fallback that needs no answer.

No new protocol route is needed, and a dir whose name is not a job id is not ours and is
left alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from agent.errors import Conflict, Refused, RequestFailed
from agent.jobs.paths import STAGING_DIR, PathNotAllowed, allowed_root, no_symlinks_below
from schemas.artifacts import ProgressReport
from schemas.errors import ErrorCode
from schemas.jobs import LeaseFence, ProgressAnswer

logger = logging.getLogger("modelforge.agent.jobs")


class ProgressRoute(Protocol):
    """The one protocol call the sweep makes: an artifact job's progress report
    (agent/jobs/reports.py: FamilyReports of the artifact family)."""

    async def progress(self, job_id: uuid.UUID, report: ProgressReport) -> ProgressAnswer: ...


class Verdict(StrEnum):
    ENDED = "ended"
    LIVE = "live"
    UNKNOWN = "unknown"


_ENDED_CONFLICTS = {ErrorCode.JOB_FINISHED}
_LIVE_CONFLICTS = {ErrorCode.LEASE_STALE, ErrorCode.LEASE_EXPIRED}


async def verdict(route: ProgressRoute, job_id: uuid.UUID) -> Verdict:
    """Whether any attempt may still resume the job, as the control plane's refusal of
    a report under a lease no one holds tells it."""
    nobodys = ProgressReport(lease=LeaseFence(lease_id=uuid.uuid4(), epoch=1), files=[])
    try:
        await route.progress(job_id, nobodys)
    except Conflict as exc:
        if exc.code in _ENDED_CONFLICTS:
            return Verdict.ENDED
        return Verdict.LIVE if exc.code in _LIVE_CONFLICTS else Verdict.UNKNOWN
    except Refused as exc:
        # Our own API's 404 only (a proxy's, or a wrong path prefix, says nothing). A
        # job of another node's (403) is not ours to judge: two nodes may share a root.
        gone = exc.status == 404 and exc.code == ErrorCode.NOT_FOUND
        return Verdict.ENDED if gone else Verdict.UNKNOWN
    except RequestFailed:
        return Verdict.UNKNOWN
    # Accepted: only the holder of a random 122-bit lease id could see this.
    return Verdict.LIVE


def _newest_change(path: Path) -> float:
    """The latest modification time of the dir or anything below it (no symlink is
    followed)."""
    newest = path.lstat().st_mtime
    for folder, dirs, files in os.walk(path):
        for name in dirs + files:
            with contextlib.suppress(OSError):
                newest = max(newest, os.lstat(os.path.join(folder, name)).st_mtime)
    return newest


@dataclass
class StagingSweep:
    route: ProgressRoute
    roots: list[str]
    period_s: float
    max_age_s: float
    _due: float = 0.0

    async def when_due(self) -> list[uuid.UUID]:
        """Sweep if the period has passed (at once the first time); the jobs removed."""
        if time.monotonic() < self._due:
            return []
        self._due = time.monotonic() + self.period_s
        return await self.sweep()

    async def sweep(self) -> list[uuid.UUID]:
        removed: list[uuid.UUID] = []
        for configured in self.roots:
            for job_id, path in self._staged(configured):
                if await self._remove(job_id, path):
                    removed.append(job_id)
        return removed

    def _staged(self, configured: str) -> list[tuple[uuid.UUID, Path]]:
        try:
            root = allowed_root(configured, self.roots)
            staging = root / STAGING_DIR
            no_symlinks_below(root, staging)
            entries = list(os.scandir(staging))
        except (PathNotAllowed, OSError):
            return []  # no staging yet, or one we may not touch
        found = []
        for entry in entries:
            try:
                job_id = uuid.UUID(entry.name)
            except ValueError:
                continue
            if str(job_id) == entry.name and entry.is_dir(follow_symlinks=False):
                found.append((job_id, Path(entry.path)))
        return found

    async def _remove(self, job_id: uuid.UUID, path: Path) -> bool:
        said = await verdict(self.route, job_id)
        if said is Verdict.LIVE:
            return False
        if said is Verdict.UNKNOWN:
            try:
                age = time.time() - await asyncio.to_thread(_newest_change, path)
            except OSError:
                return False
            if age < self.max_age_s:
                return False
            reason = f"unchanged for {age:.0f} s and the control plane cannot tell"
        else:
            reason = "the job will not be resumed"
        await asyncio.to_thread(shutil.rmtree, path, True)
        logger.info("removed the staging of job %s (%s)", job_id, reason)
        return True
