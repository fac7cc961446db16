"""What every job kind's agent routes do under a lease, once (store/leases.py holds the
rules): find the caller's job under its current lease, extend it with an answer that
carries the operator's cancel, record a typed failure with its retry."""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum

from api.deps import NodeRequest
from schemas.events import node_actor
from schemas.jobs import FailAnswer, JobKind, JobState, LeaseFence, ProgressAnswer
from store import leases
from store.models import Job


async def held(
    request: NodeRequest, kind: JobKind | tuple[JobKind, ...], job_id: uuid.UUID, fence: LeaseFence
) -> tuple[Job, datetime]:
    """The job under the caller's current lease, locked, and the database time."""
    return await leases.held(
        request.session, kind=kind, job_id=job_id, node_id=request.node.node_id, fence=fence
    )


def extended(request: NodeRequest, job: Job, now: datetime) -> ProgressAnswer:
    policy = request.state.leases
    leases.extend(job, now, policy)
    return ProgressAnswer(
        job_id=job.id,
        cancel_requested=job.cancel_requested_at is not None,
        lease=leases.lease_of(job, policy),
    )


def failed(
    request: NodeRequest, job: Job, now: datetime, *, code: StrEnum, retryable: bool, detail: str
) -> FailAnswer:
    leases.fail(
        request.session,
        job,
        now,
        request.state.leases,
        code=code,
        retryable=retryable,
        detail=detail,
        actor=node_actor(request.node.node_id),
    )
    return FailAnswer(
        job_id=job.id,
        state=JobState(job.state),
        retry_at=job.available_at if job.state == JobState.QUEUED.value else None,
    )
