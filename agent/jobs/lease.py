"""One job under its lease, whatever its kind: the work, with progress reports that keep
the lease and carry an operator's cancel back; then exactly one terminal report.

Every kind (agent/jobs/artifact.py; agent/runtime/jobs.py for the runtime kinds) holds
its lease through this one runner, so they behave alike where the protocol says they
must:

* **Keep the lease**: a progress report (the kind's own, built when it is sent) at
  least every `renew_within_s`. A transient failure is tried again next interval; any
  other refusal (409 lease stale or expired, the job finished, 401/403, 404) means the
  control plane no longer takes reports under this lease: the lease is lost.
* **Stop** when the answer says the operator cancelled (`Cancelled`: reported as the
  kind's `cancelled` failure), or when the lease is lost (`LeaseLost`: nothing more is
  reported; the next attempt, under a new lease, does the job). The work sees both at
  its own safe points through `check()`.
* **Settle** with complete or fail. The progress reporter is stopped, and a report in
  flight answered (bounded), before the terminal report goes out: once a job is settled
  nothing more is reported on it. The terminal report is retried like any other call
  (agent/retry.py: a transport error, 5xx or 429, with backoff) until the lease, as
  last renewed, ends: one 503 must not cost the whole work again under a new lease. A
  409 (the lease moved on) or any other 4xx is final.

A kind subclasses `LeasedJob` with its work and its reports; its report calls are a
`Reports` (its family's three routes: agent/jobs/reports.py, FamilyReports).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from enum import StrEnum
from typing import Final, Generic, Protocol, TypeVar

from agent.errors import RequestFailed, Transient
from agent.retry import Stopped, retry_transient
from schemas.jobs import FailAnswer, Lease, LeaseFence, ProgressAnswer

logger = logging.getLogger("modelforge.agent.jobs")

# At most this long for a progress report in flight to be answered before the terminal
# report goes out (the client's own timeout bounds it too); then it is abandoned.
SETTLE_WAIT_S = 15.0
# The backoff of a terminal report's retries (full jitter, agent/retry.py).
SETTLE_RETRY_INITIAL_S = 0.5
SETTLE_RETRY_MAX_S = 5.0

T = TypeVar("T")

ProgressT = TypeVar("ProgressT")
DoneT = TypeVar("DoneT")
FailT = TypeVar("FailT")
ProgressIn = TypeVar("ProgressIn", contravariant=True)
DoneIn = TypeVar("DoneIn", contravariant=True)
FailIn = TypeVar("FailIn", contravariant=True)


class Reports(Protocol[ProgressIn, DoneIn, FailIn]):
    """One kind's report calls under a lease (agent/client.py holds the routes)."""

    async def progress(self, job_id: uuid.UUID, report: ProgressIn) -> ProgressAnswer: ...
    async def complete(self, job_id: uuid.UUID, report: DoneIn) -> object: ...
    async def fail(self, job_id: uuid.UUID, report: FailIn) -> FailAnswer: ...


# What the wire's Note refuses (schemas/base.py: NO_CONTROL_CHARACTERS), and what would
# disguise a log line: line separators and bidirectional overrides.
_UNPRINTABLE: Final = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
DETAIL_CHARS: Final = 500


def printable_detail(text: str) -> str:
    """`text` as one safe line of at most DETAIL_CHARS: a failure's detail may quote a
    lease's value or an error's text, and it goes into the log and a Note on the wire,
    which refuses control characters (a fail report refused is a fail report lost)."""
    escaped = _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode(), text)
    return escaped[:DETAIL_CHARS]


def report_every(lease: Lease) -> float:
    """How often a job that has no progress of its own reports: twice per renewal, so
    one lost report still leaves time for the next, within 0.2 to 5 s."""
    return max(0.2, min(5.0, lease.renew_within_s / 2))


class Failed(Exception):
    """The job failed on this node: its kind's failure code, whether another attempt
    may help, and a detail for the operator (made printable_detail)."""

    def __init__(self, code: StrEnum, detail: str, *, retryable: bool) -> None:
        detail = printable_detail(detail)
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.retryable = retryable


class Cancelled(Exception):
    """The operator cancelled the job (the answer to a progress report said so)."""


class LeaseLost(Exception):
    """The control plane no longer takes reports under this lease: stop, report nothing."""


class LeasedJob(Generic[ProgressT, DoneT, FailT]):
    """A kind's work under its lease. Subclasses give `work`, `progress_report`,
    `fail_report` and `cancelled_code`; the hooks let them clean up as they settle."""

    # The kind's failure code for an operator's cancel.
    cancelled_code: StrEnum
    # What a failure the work did not foresee is reported as (a bug, or the host
    # refusing something): the job ends or retries instead of waiting out its lease.
    internal_code: StrEnum

    def __init__(
        self,
        job_id: uuid.UUID,
        lease: Lease,
        reports: Reports[ProgressT, DoneT, FailT],
        *,
        name: str,
        report_every_s: float,
    ) -> None:
        self.job_id = job_id
        self.reports = reports
        self.name = name
        self.fence = LeaseFence(lease_id=lease.lease_id, epoch=lease.epoch)
        # When the lease ends unless renewed: each progress answer moves it.
        self.expires_at = lease.expires_at
        self.report_every_s = min(report_every_s, lease.renew_within_s)
        self.cancelled = asyncio.Event()
        self.lost = asyncio.Event()
        # Set once the job's end is decided: no progress report starts after it.
        self.settling = asyncio.Event()

    # ------------------------------------------------------------ what a kind gives

    async def work(self) -> DoneT:
        """Do the job; the completion report. Raise Failed, or let check() stop it."""
        raise NotImplementedError

    def progress_report(self) -> ProgressT:
        raise NotImplementedError

    def fail_report(self, failure: Failed) -> FailT:
        raise NotImplementedError

    def on_failure(self, failure: Failed) -> None:
        """Before the fail report goes out (cancelled included)."""

    def on_fail_answer(self, answer: FailAnswer) -> None:
        """The control plane took the fail report; its answer says what follows."""

    def on_lease_lost(self) -> None:
        """The lease was lost: the work stopped, nothing is reported."""

    # ------------------------------------------------------------------- the runner

    def check(self) -> None:
        """Called by the work at its safe points: stop there if the job should stop."""
        if self.cancelled.is_set():
            raise Cancelled
        if self.lost.is_set():
            raise LeaseLost

    async def run(self) -> str:
        """Do the job and report its end; the outcome as a word (for the log and tests)."""
        reporter = asyncio.create_task(self._keep_lease())
        failure: Failed | None = None
        try:
            try:
                done = await self.work()
            finally:
                await self._stop_reporting(reporter)
            if self.lost.is_set():
                raise LeaseLost
        except Cancelled:
            failure = Failed(self.cancelled_code, "cancelled", retryable=False)
        except LeaseLost:
            logger.warning("%s: the lease was lost; stopped", self.name)
            self.on_lease_lost()
            return "lease lost"
        except Failed as failed:
            failure = failed
        except Exception as exc:  # the job settles, whatever went wrong in its work
            logger.error("%s: the work failed unexpectedly", self.name, exc_info=True)
            failure = Failed(self.internal_code, f"unexpected {type(exc).__name__}", retryable=True)
        if failure is None:
            return await self._complete(done)
        if self.lost.is_set():
            logger.warning("%s: %s, but the lease was lost first", self.name, failure.code.value)
            self.on_lease_lost()
            return "lease lost"
        return await self._fail(failure)

    async def _stop_reporting(self, reporter: asyncio.Task[None]) -> None:
        """Let a report in flight get its answer (bounded by the client's timeout, and
        by the settle bound here), then stop the reporter for good."""
        self.settling.set()
        if not reporter.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(reporter), SETTLE_WAIT_S)
            reporter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reporter

    async def _keep_lease(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.settling.wait(), self.report_every_s)
            if self.settling.is_set():
                return
            try:
                answer = await self.reports.progress(self.job_id, self.progress_report())
            except Transient:
                continue  # the next report may get through before the lease ends
            except RequestFailed:
                # 409 (lease stale or expired, job ended), 401/403, 404: not ours now.
                self.lost.set()
                return
            self.expires_at = answer.lease.expires_at
            if answer.cancel_requested:
                self.cancelled.set()

    async def _settle(self, operation: str, call: Callable[[], Awaitable[T]]) -> T:
        """A terminal report, retried while it fails transiently and the lease lasts (by
        this node's clock, and at least one report interval: a skewed clock costs some
        retries, never a report the control plane would still take; a lease that moved
        on answers 409, which is final). Stopped once the lease ended."""
        left = (self.expires_at - datetime.now(UTC)).total_seconds()
        ended = asyncio.Event()
        timer = asyncio.get_running_loop().call_later(max(left, self.report_every_s), ended.set)
        try:
            return await retry_transient(
                operation,
                call,
                stop=ended,
                initial_s=SETTLE_RETRY_INITIAL_S,
                max_s=SETTLE_RETRY_MAX_S,
                prefix=f"{self.name}: ",
            )
        finally:
            timer.cancel()

    async def _complete(self, report: DoneT) -> str:
        try:
            await self._settle("complete", lambda: self.reports.complete(self.job_id, report))
        except (RequestFailed, Stopped) as exc:
            why = "the lease ended" if isinstance(exc, Stopped) else str(exc)
            logger.warning("%s: the completion was not accepted (%s)", self.name, why)
            return "completion refused"
        logger.info("%s: complete", self.name)
        return "completed"

    async def _fail(self, failure: Failed) -> str:
        logger.warning("%s: %s (%s)", self.name, failure.code.value, failure.detail)
        self.on_failure(failure)
        report = self.fail_report(failure)
        try:
            answer = await self._settle("fail", lambda: self.reports.fail(self.job_id, report))
        except (RequestFailed, Stopped) as exc:
            why = "the lease ended" if isinstance(exc, Stopped) else str(exc)
            logger.warning("%s: the failure report was not accepted (%s)", self.name, why)
            return str(failure.code.value)
        self.on_fail_answer(answer)
        return str(failure.code.value)
