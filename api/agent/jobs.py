"""The agent routes of every job family, from one factory: GET …/next claims the node's
next job of the family, then progress, complete and fail are reported under its lease.
Each family's paths, bodies and answers are its declaration's (schemas/jobs.py:
JobFamily, all of them in schemas/job_families.py), what the store does at each report
its rules' (store/jobs.py); the lease rules themselves are store/leases.py's. Only the
node the job belongs to gets past authentication and ownership, and only the current,
unexpired lease gets past the fence."""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable, Coroutine
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Response, status

from api.deps import NodeRequest, NodeTransaction
from api.errors import error_responses
from schemas.base import WireModel
from schemas.events import node_actor
from schemas.job_families import FAMILIES
from schemas.jobs import FailAnswer, JobFamily, JobKind, JobState, ProgressAnswer
from store import leases
from store.jobs import RULES, FamilyRules, Reported
from store.models import Job

# A report can also name a job that does not exist (404).
REPORT = error_responses(404)
NOTHING: dict[int | str, Any] = {204: {"description": "nothing to do"}}
Endpoint = Callable[..., Coroutine[Any, Any, Any]]


def _reported(request: NodeRequest, job: Job, now: datetime) -> Reported:
    return Reported(
        session=request.session,
        job=job,
        now=now,
        actor=node_actor(request.node.node_id),
        leases=request.state.leases,
        reconcile=request.state.settings.reconcile_policy(),
    )


async def _held(request: NodeRequest, family: JobFamily, job_id: uuid.UUID, body: Any) -> Reported:
    """The job under the caller's current lease (every report carries it), locked, at
    database time."""
    job, now = await leases.held(
        request.session,
        kind=family.kinds,
        job_id=job_id,
        node_id=request.node.node_id,
        fence=body.lease,
    )
    return _reported(request, job, now)


def _extended(request: NodeRequest, job: Job, now: datetime) -> ProgressAnswer:
    policy = request.state.leases
    leases.extend(job, now, policy)
    return ProgressAnswer(
        job_id=job.id,
        cancel_requested=job.cancel_requested_at is not None,
        lease=leases.lease_of(job, policy),
    )


def _failed(reported: Reported, body: Any) -> FailAnswer:
    """A typed failure (the family's fail body: FailReport, RuntimeJobFail), retried with
    backoff while it may help and attempts remain."""
    job = reported.job
    leases.fail(
        reported.session,
        job,
        reported.now,
        reported.leases,
        code=body.code,
        retryable=body.retryable,
        detail=body.detail,
        actor=reported.actor,
    )
    return FailAnswer(
        job_id=job.id,
        state=JobState(job.state),
        retry_at=job.available_at if job.state == JobState.QUEUED.value else None,
    )


def _typed(endpoint: Endpoint, body: Any) -> Endpoint:
    """The endpoint with its body typed as the family declares it (FastAPI reads the
    body's model from the signature)."""
    signature = inspect.signature(endpoint)
    parameters = [
        parameter.replace(annotation=body) if parameter.name == "body" else parameter
        for parameter in signature.parameters.values()
    ]
    setattr(endpoint, "__signature__", signature.replace(parameters=parameters))  # noqa: B010
    return endpoint


def job_routes(rules: FamilyRules) -> APIRouter:
    """The four routes of one family; each operation keeps its family's name
    (claim_<name>_job, report_<name>_progress, complete_<name>_job, fail_<name>_job)."""
    family = rules.family
    name = family.name
    completion = rules.completion()
    router = APIRouter(tags=["agent"], responses=error_responses(401, 403, 409, 413, 422, 503))

    async def claim(request: NodeTransaction) -> Response | WireModel:
        job = await leases.claim(
            request.session,
            kind=family.kinds,
            node_id=request.node.node_id,
            policy=request.state.leases,
            actor=node_actor(request.node.node_id),
        )
        if job is None:
            return Response(status_code=status.HTTP_204_NO_CONTENT)
        reported = _reported(request, job, job.updated_at)
        await rules.claimed(reported)
        declared = family.of(job.kind)
        return declared.claim.model_validate(
            {
                "job_id": job.id,
                "kind": JobKind(job.kind),
                "attempt": job.attempt,
                "spec": declared.spec.model_validate(job.spec),
                "lease": leases.lease_of(job, request.state.leases),
            }
        )

    async def progress(job_id: uuid.UUID, body: Any, request: NodeTransaction) -> ProgressAnswer:
        reported = await _held(request, family, job_id, body)
        rules.progress(reported, body)
        return _extended(request, reported.job, reported.now)

    async def complete(job_id: uuid.UUID, body: Any, request: NodeTransaction) -> WireModel:
        reported = await _held(request, family, job_id, body)
        answer = await completion(reported, body)
        await rules.settled(reported)
        return answer

    async def fail(job_id: uuid.UUID, body: Any, request: NodeTransaction) -> FailAnswer:
        reported = await _held(request, family, job_id, body)
        answer = _failed(reported, body)
        await rules.settled(reported)
        return answer

    docs = family.docs
    routes: tuple[tuple[str, Endpoint, str, str, str, Any, dict[int | str, Any]], ...] = (
        (family.next, claim, "GET", f"claim_{name}_job", docs.claim, family.claim, NOTHING),
        (
            family.progress_path,
            _typed(progress, family.progress),
            "POST",
            f"report_{name}_progress",
            docs.progress,
            ProgressAnswer,
            REPORT,
        ),
        (
            family.complete_path,
            _typed(complete, family.completion),
            "POST",
            f"complete_{name}_job",
            docs.complete,
            family.completed,
            REPORT,
        ),
        (
            family.fail_path,
            _typed(fail, family.fail),
            "POST",
            f"fail_{name}_job",
            docs.fail,
            FailAnswer,
            REPORT,
        ),
    )
    for path, endpoint, method, operation, doc, answer, responses in routes:
        router.add_api_route(
            path,
            endpoint,
            methods=[method],
            name=operation,
            description=inspect.cleandoc(doc),
            response_model=answer,
            responses=responses,
        )
    return router


router = APIRouter()
for _family in FAMILIES:
    router.include_router(job_routes(RULES[_family.name]))
