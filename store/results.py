"""Job results: what a completed job established, one typed model per kind, in the
jobs table's own `result` column.

A result is not progress: progress is the current attempt's latest report, cleared by
the next claim and overwritten by every report; a result is written once, by the
completion that ends the job (store/leases.py: complete), and read back as the kind's
model. The table below is the one place that says which model a kind's result is, so a
new kind (deployments) adds a line here rather than a key in someone's progress.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, TypeVar

from schemas.artifacts import ArtifactResult
from schemas.base import WireModel
from schemas.deployments import DrainResult, LoadResult
from schemas.deployments import HealthResult as DeploymentHealthResult
from schemas.deployments import UnloadResult as DeploymentUnloadResult
from schemas.jobs import JobKind
from schemas.runtime import HealthResult, ProbeResult, UnloadResult
from store.models import Job

RESULTS: Final[Mapping[JobKind, type[WireModel]]] = {
    JobKind.ARTIFACT_ACQUIRE: ArtifactResult,
    JobKind.RUNTIME_PROBE: ProbeResult,
    JobKind.RUNTIME_HEALTH: HealthResult,
    JobKind.RUNTIME_UNLOAD: UnloadResult,
    JobKind.DEPLOYMENT_LOAD: LoadResult,
    JobKind.DEPLOYMENT_HEALTH: DeploymentHealthResult,
    JobKind.DEPLOYMENT_DRAIN: DrainResult,
    JobKind.DEPLOYMENT_UNLOAD: DeploymentUnloadResult,
}

R = TypeVar("R", bound=WireModel)


def _model(job: Job) -> type[WireModel]:
    return RESULTS[JobKind(job.kind)]


def record(job: Job, result: WireModel) -> None:
    """Store the result of the job's kind; another kind's result is a programming error."""
    model = _model(job)
    if type(result) is not model:
        raise TypeError(f"a {job.kind} job's result is a {model.__name__}")
    job.result = result.model_dump(mode="json")


def read(job: Job, model: type[R]) -> R | None:
    """The job's result as its kind's model; None until the job has completed."""
    if _model(job) is not model:
        raise TypeError(f"a {job.kind} job's result is a {_model(job).__name__}")
    return None if job.result is None else model.model_validate(job.result)
