"""A runtime job under its lease, whatever its kind: the work, with progress reports
(the phase) that keep the lease and carry an operator's cancel; then complete or fail
with a normalised code. agent/runtime/probe.py and device_jobs.py do the work."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import Literal, Protocol

from agent.errors import RequestFailed, Transient
from agent.runtime.worker import RuntimeWorker
from schemas.jobs import FailAnswer, LeaseFence, ProgressAnswer
from schemas.runtime import (
    DeviceJobClaim,
    HealthComplete,
    ProbeClaim,
    ProbeComplete,
    ProbeFail,
    ProbeHealth,
    ProbeOutcome,
    ProbeProgress,
    RuntimeFailure,
    UnloadComplete,
)

logger = logging.getLogger("modelforge.runtime.jobs")

# Worth another attempt: the next start may well succeed.
RETRYABLE = frozenset(
    {RuntimeFailure.STARTUP_TIMEOUT, RuntimeFailure.PROCESS_EXITED, RuntimeFailure.INTERNAL}
)


Completion = ProbeComplete | HealthComplete | UnloadComplete


class ProbeReports(Protocol):
    async def probe_progress(self, job_id: uuid.UUID, report: ProbeProgress) -> ProgressAnswer: ...
    async def complete_probe(self, job_id: uuid.UUID, report: Completion) -> ProbeOutcome: ...
    async def fail_probe(self, job_id: uuid.UUID, report: ProbeFail) -> FailAnswer: ...


class Failed(Exception):
    def __init__(
        self, code: RuntimeFailure, detail: str, health: ProbeHealth | None = None
    ) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.health = health


class Cancelled(Exception):
    pass


class LeasedRun:
    """One runtime job under its lease: the work, with progress reports (the phase)
    keeping the lease and carrying an operator's cancel; then complete or fail."""

    def __init__(
        self, claim: ProbeClaim | DeviceJobClaim, reports: ProbeReports, worker: RuntimeWorker
    ) -> None:
        self.claim = claim
        self.reports = reports
        self.worker = worker
        self.fence = LeaseFence(lease_id=claim.lease.lease_id, epoch=claim.lease.epoch)
        self.phase: Literal["verifying", "loading", "probing"] = "verifying"
        self.cancelled = asyncio.Event()
        self.lost = asyncio.Event()
        self.name = f"{claim.kind} {claim.job_id}"

    async def work(self) -> Completion:
        raise NotImplementedError

    async def run(self) -> str:
        reporter = asyncio.create_task(self._keep_lease())
        failure: Failed | None = None
        try:
            report = await self.work()
        except Cancelled:
            failure = Failed(RuntimeFailure.CANCELLED, "cancelled")
        except Failed as failed:
            failure = failed
        finally:
            # No progress report after the terminal one: the lease keeping ends first.
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporter
        if failure is not None:
            return await self._fail(failure)
        if self.lost.is_set():
            return "lease lost"
        try:
            await self.reports.complete_probe(self.claim.job_id, report)
        except RequestFailed as exc:
            logger.warning("%s: the completion was not accepted (%s)", self.name, exc)
            return "completion refused"
        logger.info("%s: complete (%s)", self.name, report.model_dump_json(exclude={"lease"}))
        return "completed"

    def _check(self) -> None:
        if self.cancelled.is_set():
            raise Cancelled

    async def _keep_lease(self) -> None:
        interval = max(0.2, min(5.0, self.claim.lease.renew_within_s / 2))
        while True:
            await asyncio.sleep(interval)
            try:
                answer = await self.reports.probe_progress(
                    self.claim.job_id, ProbeProgress(lease=self.fence, phase=self.phase)
                )
            except Transient:
                continue
            except RequestFailed:
                self.lost.set()
                return
            if answer.cancel_requested:
                self.cancelled.set()

    async def _fail(self, failure: Failed) -> str:
        logger.warning("%s: %s (%s)", self.name, failure.code.value, failure.detail)
        report = ProbeFail(
            lease=self.fence,
            code=failure.code,
            retryable=failure.code in RETRYABLE,
            detail=failure.detail[:500],
            health=failure.health,
        )
        try:
            await self.reports.fail_probe(self.claim.job_id, report)
        except RequestFailed as exc:
            logger.warning("%s: the failure report was not accepted (%s)", self.name, exc)
        return failure.code.value
