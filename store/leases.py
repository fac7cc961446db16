"""Leases on jobs: claim, fence, extend, settle and expire, for every job kind.

The agent routes of every job family (api/agent/jobs.py) and the lease-expiry worker
(workers/leases.py) all go through here, so the rules exist once:

* **Claim** picks the node's oldest claimable job of the kind with `FOR UPDATE SKIP
  LOCKED`: any number of concurrent claims hand a job to exactly one of them, and none
  waits on another. Each claim bumps the job's fencing epoch and issues a new lease id.
* **Fence**: a report must name the job's current lease id and epoch, and the lease
  must not have run out (database clock). Anything else is refused, so a holder that
  lost its lease can never touch the attempt that replaced it.
* **Settle**: complete, fail (retry with backoff while attempts remain and the failure
  is retryable), or cancel. A cancelled job stays cancelled, whatever the node says.
* **Expire**: a worker takes back every lease past its expiry, in batches, skipping
  rows another worker or a report holds; the job retries or ends `failed`
  (lease_expired) after its last attempt.

Every change records its event (store/changes.py) in the same transaction. All times
come from the database clock (statement_timestamp), never a host's.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from schemas.base import WireModel
from schemas.errors import ErrorCode
from schemas.events import EventType, JobEvent
from schemas.jobs import FailureCode, JobKind, JobState, Lease, LeaseFence
from store import changes, results
from store.errors import Conflict, Missing, NotOwned
from store.locks import node_try_xact_lock
from store.models import Job
from store.nodes import now as database_now

QUEUED = JobState.QUEUED.value
LEASED = JobState.LEASED.value
FINISHED = frozenset({JobState.SUCCEEDED.value, JobState.FAILED.value, JobState.CANCELLED.value})


@dataclass(frozen=True)
class LeasePolicy:
    # A lease lasts this long from its claim or its last progress report.
    lease_s: float = 60.0
    # Backoff before attempt n + 1: retry_base_s * 2**(n - 1), at most retry_max_s.
    retry_base_s: float = 5.0
    retry_max_s: float = 300.0

    def retry_delay(self, attempt: int) -> timedelta:
        return timedelta(seconds=min(self.retry_max_s, self.retry_base_s * 2 ** (attempt - 1)))


def lease_of(job: Job, policy: LeasePolicy) -> Lease:
    assert job.lease_id is not None and job.lease_expires_at is not None
    return Lease(
        lease_id=job.lease_id,
        epoch=job.lease_epoch,
        expires_at=job.lease_expires_at,
        # Half the lease: one late report still leaves time for the next.
        renew_within_s=policy.lease_s / 2,
    )


def event(job: Job, **extra: object) -> JobEvent:
    leased = job.state == LEASED
    return JobEvent(
        job_id=job.id,
        node_id=job.node_id,
        kind=job.kind,
        state=job.state,
        attempt=job.attempt,
        epoch=job.lease_epoch if job.lease_epoch else None,
        lease_expires_at=job.lease_expires_at if leased else None,
        **extra,
    )


def _kinds(kind: JobKind | tuple[JobKind, ...]) -> list[str]:
    return [k.value for k in (kind if isinstance(kind, tuple) else (kind,))]


async def queue(
    session: AsyncSession,
    kind: JobKind,
    node_id: uuid.UUID,
    spec: WireModel,
    max_attempts: int,
    *,
    actor: str,
) -> Job:
    """A new job of any kind, queued for the node now, and its job.created event (the
    notification that wakes the node)."""
    now = await database_now(session)
    job = Job(
        id=uuid.uuid4(),
        kind=kind.value,
        node_id=node_id,
        state=QUEUED,
        spec=spec.model_dump(mode="json"),
        attempt=0,
        max_attempts=max_attempts,
        available_at=now,
        lease_epoch=0,
        created_at=now,
        updated_at=now,
    )
    session.add(job)
    changes.record(session, EventType.JOB_CREATED, event(job), actor=actor)
    return job


async def claim(
    session: AsyncSession,
    *,
    kind: JobKind | tuple[JobKind, ...],
    node_id: uuid.UUID,
    policy: LeasePolicy,
    actor: str,
) -> Job | None:
    """Lease the node's oldest claimable job of this kind (or of any of these kinds) to
    the caller; None if none."""
    # The database clock comes with the row: one round trip fewer on the claim, which
    # is on the path from a job's creation to its node starting it.
    found = (
        await session.execute(
            select(Job, func.statement_timestamp())
            .where(
                Job.node_id == node_id,
                Job.kind.in_(_kinds(kind)),
                Job.state == QUEUED,
                Job.available_at <= func.statement_timestamp(),
            )
            .order_by(Job.available_at, Job.id)
            .limit(1)
            .with_for_update(skip_locked=True, of=Job)
        )
    ).one_or_none()
    if found is None:
        return None
    job: Job = found[0]
    now: datetime = found[1]
    job.state = LEASED
    job.attempt += 1
    job.lease_epoch += 1
    job.lease_id = uuid.uuid4()
    job.lease_expires_at = now + timedelta(seconds=policy.lease_s)
    job.progress = None
    job.updated_at = now
    changes.record(session, EventType.JOB_CLAIMED, event(job), actor=actor)
    return job


async def get_for_update(session: AsyncSession, job_id: uuid.UUID) -> Job | None:
    return await session.get(Job, job_id, with_for_update=True, populate_existing=True)


async def held(
    session: AsyncSession,
    *,
    kind: JobKind | tuple[JobKind, ...],
    job_id: uuid.UUID,
    node_id: uuid.UUID,
    fence: LeaseFence,
) -> tuple[Job, datetime]:
    """The job, locked, if `fence` is its current, unexpired lease; and the database time.

    Refusals, in this order: no such job of this kind (404), another node's job (403),
    a finished job, a lease that is not the current one, a lease that ran out (409).
    The order is relied on: the agent's staging sweep (agent/jobs/sweep.py) tells a
    live job from an ended one by the refusal of a lease no one holds.
    """
    job = await get_for_update(session, job_id)
    if job is None or job.kind not in _kinds(kind):
        raise Missing(f"no {' or '.join(_kinds(kind))} job {job_id}", code=ErrorCode.NOT_FOUND)
    if job.node_id != node_id:
        raise NotOwned("this job belongs to another node", code=ErrorCode.JOB_NOT_OWNED)
    if job.state in FINISHED:
        raise Conflict(
            f"the job already ended ({job.state})",
            code=ErrorCode.JOB_FINISHED,
            extra={"state": job.state},
        )
    if job.state != LEASED or job.lease_id != fence.lease_id or job.lease_epoch != fence.epoch:
        raise Conflict(
            "this lease is not the job's current one",
            code=ErrorCode.LEASE_STALE,
            extra={"epoch": job.lease_epoch},
        )
    now = await database_now(session)
    assert job.lease_expires_at is not None
    if job.lease_expires_at <= now:
        raise Conflict("this lease ran out", code=ErrorCode.LEASE_EXPIRED)
    return job, now


def extend(job: Job, now: datetime, policy: LeasePolicy) -> None:
    job.lease_expires_at = now + timedelta(seconds=policy.lease_s)
    job.updated_at = now


def _finish(job: Job, state: JobState, now: datetime) -> None:
    job.state = state.value
    job.lease_id = None
    job.lease_expires_at = None
    job.updated_at = now
    job.finished_at = now


def complete(
    session: AsyncSession, job: Job, now: datetime, *, result: WireModel, actor: str
) -> None:
    """The job succeeded: its result (the kind's model, store/results.py) is recorded
    with the completion, never left in progress."""
    results.record(job, result)
    _finish(job, JobState.SUCCEEDED, now)
    job.failure_code = job.failure_retryable = job.failure_detail = None
    changes.record(session, EventType.JOB_COMPLETED, event(job), actor=actor)


def cancel_now(session: AsyncSession, job: Job, now: datetime, *, actor: str) -> None:
    _finish(job, JobState.CANCELLED, now)
    job.failure_code = FailureCode.CANCELLED.value
    job.failure_retryable = False
    changes.record(session, EventType.JOB_CANCELLED, event(job), actor=actor)


def fail(
    session: AsyncSession,
    job: Job,
    now: datetime,
    policy: LeasePolicy,
    *,
    code: StrEnum,
    retryable: bool,
    detail: str,
    actor: str,
    expired: bool = False,
) -> None:
    """An attempt ended without success: retry after a backoff if it may help and
    attempts remain, else the job fails for good. A job an operator cancelled ends
    cancelled instead, whatever the failure."""
    job.failure_code = code.value
    job.failure_retryable = retryable
    job.failure_detail = detail or None
    # Every kind's failure codes (FailureCode, RuntimeFailure) spell cancelled alike.
    if job.cancel_requested_at is not None or code.value == FailureCode.CANCELLED.value:
        cancel_now(session, job, now, actor=actor)
        return
    if expired:
        changes.record(
            session,
            EventType.JOB_EXPIRED,
            event(job, failure_code=code.value, retryable=retryable),
            actor=actor,
        )
    if retryable and job.attempt < job.max_attempts:
        retry_at = now + policy.retry_delay(job.attempt)
        job.state = QUEUED
        job.lease_id = None
        job.lease_expires_at = None
        job.available_at = retry_at
        job.updated_at = now
        changes.record(
            session,
            EventType.JOB_RETRY_SCHEDULED,
            event(job, failure_code=code.value, retryable=True, retry_at=retry_at),
            actor=actor,
        )
        return
    _finish(job, JobState.FAILED, now)
    changes.record(
        session,
        EventType.JOB_FAILED,
        event(job, failure_code=code.value, retryable=retryable),
        actor=actor,
    )


def request_cancel(session: AsyncSession, job: Job, now: datetime, *, actor: str) -> None:
    """An operator's cancel: a queued job ends at once; a leased one is told on its next
    progress report and ends when it reports back (or its lease runs out)."""
    if job.state in FINISHED:
        raise Conflict(
            f"the job already ended ({job.state})",
            code=ErrorCode.JOB_FINISHED,
            extra={"state": job.state},
        )
    if job.state == QUEUED:
        job.cancel_requested_at = now
        cancel_now(session, job, now, actor=actor)
        return
    if job.cancel_requested_at is None:
        job.cancel_requested_at = now
        job.updated_at = now
        changes.record(session, EventType.JOB_CANCEL_REQUESTED, event(job), actor=actor)


async def expire_due(
    session: AsyncSession, policy: LeasePolicy, *, batch_size: int, actor: str
) -> list[Job]:
    """Take back up to `batch_size` leases past their expiry; the jobs it settled.

    SKIP LOCKED: rows another worker is expiring, or a holder is reporting on right
    now, are left for the next sweep (a report that commits first extends the lease,
    and the row is no longer due); so is a job whose node's event lock is held.
    """
    due = (
        (
            await session.execute(
                select(Job)
                .where(Job.state == LEASED, Job.lease_expires_at < func.statement_timestamp())
                .order_by(Job.lease_expires_at)
                .limit(batch_size)
                .with_for_update(skip_locked=True)
            )
        )
        .scalars()
        .all()
    )
    if not due:
        return []
    now = await database_now(session)
    settled: list[Job] = []
    for job in due:
        # The node's event lock, so that this job event takes its place in the node's
        # commit order (store/locks.py). Only tried: this transaction already holds job
        # rows, so waiting for the node could deadlock; a busy node waits for the next
        # sweep (its holder may be reporting on this very job).
        if not (await session.execute(select(node_try_xact_lock(job.node_id)))).scalar_one():
            continue
        settled.append(job)
        fail(
            session,
            job,
            now,
            policy,
            code=FailureCode.LEASE_EXPIRED,
            retryable=True,
            detail="the lease ran out without a report",
            actor=actor,
            expired=True,
        )
    return settled


async def list_jobs(
    session: AsyncSession,
    *,
    kind: JobKind | tuple[JobKind, ...],
    node_id: uuid.UUID | None,
    states: list[JobState],
    limit: int,
    offset: int,
) -> list[Job]:
    """Jobs of one kind (or of these kinds), newest first."""
    query = select(Job).where(Job.kind.in_(_kinds(kind)))
    if node_id is not None:
        query = query.where(Job.node_id == node_id)
    if states:
        query = query.where(Job.state.in_([s.value for s in states]))
    rows = await session.execute(
        query.order_by(Job.created_at.desc(), Job.id).limit(limit).offset(offset)
    )
    return list(rows.scalars().all())
