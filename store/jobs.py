"""What the store does at each report of a job family's agent routes (api/agent/jobs.py
serves them all), derived from the family's declaration (schemas/jobs.py: JobFamily).

Every family has the same four hooks: after a claim, at a progress report, at the
completion, and once the job settled (completed, failed for good, or queued again for
a retry). Most take the defaults: the progress is a phase, the completion must be of the
job's own kind (422 otherwise) and becomes its result. A family with more to do names its
own hook from its domain module: an artifact acquisition's byte counts and verified
inventory (store/artifacts.py), a probe's evidence (store/runtime.py), the deployment a
deployment job moves (store/deployments/rules.py). The table at the end is the one place
that says which."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from sqlalchemy.ext.asyncio import AsyncSession

from schemas.artifacts import ARTIFACT_FAMILY, CompleteAnswer, CompleteReport, ProgressReport
from schemas.base import WireModel
from schemas.deployments import DEPLOYMENT_FAMILY
from schemas.errors import ErrorCode
from schemas.jobs import JobFamily, JobState
from schemas.runtime import RUNTIME_FAMILY, ProbeComplete, RuntimeJobOutcome, RuntimeJobProgress
from store import artifacts, leases, results, runtime
from store.deployments import rules as deployments
from store.errors import Invalid, Missing
from store.leases import LeasePolicy
from store.models import Job


@dataclass(frozen=True)
class Reported:
    """A report made under a job's current lease: the transaction, the database time,
    who made it, and the policies its hooks apply."""

    session: AsyncSession
    job: Job
    now: datetime
    actor: str
    leases: LeasePolicy
    reconcile: deployments.ReconcilePolicy


Hook = Callable[[Reported], Awaitable[None]]
Progress = Callable[[Reported, Any], None]
Completion = Callable[[Reported, Any], Awaitable[WireModel]]


async def job_of(
    session: AsyncSession, family: JobFamily, job_id: uuid.UUID, *, lock: bool = False
) -> Job:
    """A job of one of the family's kinds (404 for none, or another family's)."""
    job = await leases.get_for_update(session, job_id) if lock else await session.get(Job, job_id)
    if job is None or job.kind not in family.kinds:
        raise Missing(f"no {family.name} job {job_id}", code=ErrorCode.NOT_FOUND)
    return job


def record_phase(reported: Reported, report: RuntimeJobProgress) -> None:
    """The phase the job is in (what an operator sees while it runs)."""
    reported.job.progress = {"phase": report.phase, "reported_at": reported.now.isoformat()}


def check_kind(family: JobFamily, job: Job, report: WireModel) -> None:
    """A completion must be the job's own kind's (422 otherwise)."""
    expected = family.of(job.kind).completion
    if type(report) is not expected:
        reported = next(t.kind for t in family.types if t.completion is type(report))
        raise Invalid(
            f"this is a {job.kind} job; the report is a {reported} one",
            code=ErrorCode.VALIDATION_FAILED,
        )


def record_result(family: JobFamily, reported: Reported, report: WireModel) -> None:
    """Complete the job with its result: what its kind's completion reports of it."""
    job = reported.job
    result = results.of_completion(family.of(job.kind), report)
    leases.complete(reported.session, job, reported.now, result=result, actor=reported.actor)


def outcome(job: Job) -> RuntimeJobOutcome:
    return RuntimeJobOutcome(job_id=job.id, state=JobState(job.state))


def default_completion(family: JobFamily) -> Completion:
    """The default completion: of the job's own kind, recorded as its result."""

    async def completed(reported: Reported, report: WireModel) -> RuntimeJobOutcome:
        check_kind(family, reported.job, report)
        record_result(family, reported, report)
        return outcome(reported.job)

    return completed


async def _nothing(reported: Reported) -> None:
    """A hook with nothing to do."""


@dataclass(frozen=True)
class FamilyRules:
    family: JobFamily
    claimed: Hook = _nothing
    progress: Progress = record_phase
    # None: the default completion (of the job's own kind, recorded as its result).
    complete: Completion | None = None
    settled: Hook = _nothing

    def completion(self) -> Completion:
        return self.complete or default_completion(self.family)


# Artifacts --------------------------------------------------------------------------------


def _artifact_progress(reported: Reported, report: ProgressReport) -> None:
    artifacts.record_progress(
        reported.session, reported.job, report, reported.now, actor=reported.actor
    )


async def _artifact_completed(reported: Reported, report: CompleteReport) -> CompleteAnswer:
    job = reported.job
    check_kind(ARTIFACT_FAMILY, job, report)
    mismatches = await artifacts.complete(
        reported.session, job, report, reported.now, reported.leases, actor=reported.actor
    )
    return CompleteAnswer(job_id=job.id, state=JobState(job.state), mismatches=mismatches)


# Runtime jobs -----------------------------------------------------------------------------


async def _runtime_completed(reported: Reported, report: WireModel) -> RuntimeJobOutcome:
    """A probe's completion also records its evidence."""
    job = reported.job
    check_kind(RUNTIME_FAMILY, job, report)
    if isinstance(report, ProbeComplete):
        await runtime.complete_probe(
            reported.session, job, report, reported.now, actor=reported.actor
        )
    else:
        record_result(RUNTIME_FAMILY, reported, report)
    return outcome(job)


# Deployments ------------------------------------------------------------------------------


async def _deployment_claimed(reported: Reported) -> None:
    job = reported.job
    await deployments.on_claimed(reported.session, job, job.updated_at, actor=reported.actor)


async def _deployment_settled(reported: Reported) -> None:
    job = reported.job
    await deployments.on_settled(
        reported.session, job, job.updated_at, actor=reported.actor, policy=reported.reconcile
    )


RULES: Final[Mapping[str, FamilyRules]] = {
    rules.family.name: rules
    for rules in (
        FamilyRules(ARTIFACT_FAMILY, progress=_artifact_progress, complete=_artifact_completed),
        FamilyRules(RUNTIME_FAMILY, complete=_runtime_completed),
        FamilyRules(DEPLOYMENT_FAMILY, claimed=_deployment_claimed, settled=_deployment_settled),
    )
}
