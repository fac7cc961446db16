"""The runtime worker's protocol routes: its report stream (ordered like inventory), and
the runtime jobs (probe, health, unload) over the shared leases (store/leases.py), with
the same fencing as artifact jobs: only the node the job belongs to, under its current
lease."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Response, status

from api.agent import leased
from api.deps import NodeTransaction
from api.errors import error_responses
from schemas.agent import IngestResult
from schemas.events import node_actor
from schemas.jobs import FailAnswer, JobKind, JobState, ProgressAnswer
from schemas.protocol import (
    RUNTIME,
    RUNTIME_JOB_COMPLETE,
    RUNTIME_JOB_FAIL,
    RUNTIME_JOB_PROGRESS,
    RUNTIME_JOBS_NEXT,
)
from schemas.runtime import (
    DeviceJobClaim,
    DeviceSpec,
    ProbeClaim,
    RuntimeClaim,
    RuntimeComplete,
    RuntimeJobFail,
    RuntimeJobOutcome,
    RuntimeJobProgress,
)
from schemas.runtime_local import RuntimeReport
from store import leases, runtime
from store.ingest import ingest_runtime

router = APIRouter(tags=["agent"], responses=error_responses(401, 403, 409, 413, 422, 503))
REPORT = error_responses(404)


@router.put(RUNTIME)
async def runtime_report(body: RuntimeReport, request: NodeTransaction) -> IngestResult:
    """Devices, loaded and served models, queue depths and the binaries it has."""
    return await ingest_runtime(
        request.session,
        request.node,
        body,
        future_skew_limit_s=request.state.settings.future_skew_limit_s,
    )


@router.get(
    RUNTIME_JOBS_NEXT,
    response_model=RuntimeClaim,
    responses={204: {"description": "nothing to do"}},
)
async def claim_runtime_job(request: NodeTransaction) -> ProbeClaim | DeviceJobClaim | Response:
    """The node's next runtime job of any kind (probe, health, unload), by `kind`."""
    job = await leases.claim(
        request.session,
        kind=runtime.KINDS,
        node_id=request.node.node_id,
        policy=request.state.leases,
        actor=node_actor(request.node.node_id),
    )
    if job is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    lease = leases.lease_of(job, request.state.leases)
    if job.kind == JobKind.RUNTIME_PROBE:
        return ProbeClaim(
            job_id=job.id, attempt=job.attempt, spec=runtime.probe_spec(job), lease=lease
        )
    return DeviceJobClaim(
        job_id=job.id,
        kind=job.kind,
        attempt=job.attempt,
        spec=DeviceSpec.model_validate(job.spec),
        lease=lease,
    )


@router.post(RUNTIME_JOB_PROGRESS, responses=REPORT)
async def report_runtime_progress(
    job_id: uuid.UUID, body: RuntimeJobProgress, request: NodeTransaction
) -> ProgressAnswer:
    """The phase; extends the lease. The answer says whether to stop (cancelled)."""
    job, now = await leased.held(request, runtime.KINDS, job_id, body.lease)
    job.progress = {"phase": body.phase, "reported_at": now.isoformat()}
    return leased.extended(request, job, now)


@router.post(RUNTIME_JOB_COMPLETE, responses=REPORT)
async def complete_runtime_job(
    job_id: uuid.UUID, body: RuntimeComplete, request: NodeTransaction
) -> RuntimeJobOutcome:
    """A probe's layered health and measured evidence (stored per node, device,
    artifact, profile and environment), or a health or unload job's report; the body
    must be of the job's kind."""
    job, now = await leased.held(request, runtime.KINDS, job_id, body.lease)
    await runtime.complete(request.session, job, body, now, actor=node_actor(request.node.node_id))
    return RuntimeJobOutcome(job_id=job.id, state=JobState(job.state))


@router.post(RUNTIME_JOB_FAIL, responses=REPORT)
async def fail_runtime_job(
    job_id: uuid.UUID, body: RuntimeJobFail, request: NodeTransaction
) -> FailAnswer:
    """A normalised runtime failure. Retried with backoff while it may help."""
    job, now = await leased.held(request, runtime.KINDS, job_id, body.lease)
    return leased.failed(
        request, job, now, code=body.code, retryable=body.retryable, detail=body.detail
    )
