"""Job results: what a completed job established, one typed model per kind, in the
jobs table's own `result` column.

A result is not progress: progress is the current attempt's latest report, cleared by
the next claim and overwritten by every report; a result is written once, by the
completion that ends the job (store/leases.py: complete), and read back as the kind's
model. Which model a kind's result is comes from the kind's declaration (schemas/jobs.py:
JobType.result), so a new kind adds nothing here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, TypeVar

from schemas.base import WireModel
from schemas.job_families import FAMILIES
from schemas.jobs import JobKind, JobType
from store.models import Job

RESULTS: Final[Mapping[JobKind, type[WireModel]]] = {
    declared.kind: declared.result for family in FAMILIES for declared in family.types
}

R = TypeVar("R", bound=WireModel)


def _model(job: Job) -> type[WireModel]:
    return RESULTS[JobKind(job.kind)]


def of_completion(declared: JobType, report: WireModel) -> WireModel:
    """The result a completion reports: the completion's fields that the kind's result
    declares (the lease and the kind are the report's, not the result's)."""
    fields = set(declared.result.model_fields)
    return declared.result.model_validate(report.model_dump(include=fields))


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
