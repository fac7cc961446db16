"""The operator routes every job family shares, from one factory: list its jobs (newest
first, by node and state), get one, and cancel one. What each job is and how it is shown
is its family's declaration (schemas/jobs.py: JobFamily; api/admin/views.py:
family_job_view); what the factory is told besides is where the family's jobs are listed,
the page that lists them, and what the document says of the routes. Creating a job is
each family's own route (api/admin/artifact_jobs.py, runtime.py, deployments.py): what an
operator asks for differs by family."""

from __future__ import annotations

import inspect
import uuid
from dataclasses import dataclass
from typing import Annotated, Any, Union

from fastapi import APIRouter, Query
from pydantic import Field

from api.admin.views import family_job_view
from api.deps import AdminTransaction
from api.errors import error_responses
from schemas.admin import PageLimit
from schemas.base import CountParam, WireModel
from schemas.events import OPERATOR_ACTOR
from schemas.jobs import JobFamily, JobState, JobView
from store import jobs, leases, nodes


@dataclass(frozen=True)
class AdminJobs:
    """One family's operator routes: `path` lists its jobs, `path/{job_id}` is one, and
    `path/{job_id}/cancel` cancels one where `cancel` is set (its text the document's)."""

    family: JobFamily
    path: str
    page: type[WireModel]
    # What the document says of the list and of cancelling ("" for nothing); cancel
    # None: the family's jobs are not cancelled one by one (no cancel route).
    listed: str = ""
    cancel: str | None = ""


def job_answer(family: JobFamily) -> Any:
    """The answer for one job of the family: its one kind's view, or its kinds' views
    told apart by `kind`."""
    views = tuple(job_type.view for job_type in family.types)
    if len(views) == 1:
        return views[0]
    return Annotated[Union[views], Field(discriminator="kind")]  # noqa: UP007


def job_routes(admin: AdminJobs) -> APIRouter:
    """A family's list, get and cancel routes; each operation keeps its family's name
    (list_<name>_jobs, get_<name>_job, cancel_<name>_job)."""
    family = admin.family
    name = family.name
    answer = job_answer(family)
    router = APIRouter()

    async def listed(
        session: AdminTransaction,
        node_id: uuid.UUID | None = None,
        state: Annotated[list[JobState] | None, Query()] = None,
        limit: PageLimit = 100,
        offset: CountParam = 0,
    ) -> WireModel:
        rows = await leases.list_jobs(
            session,
            kind=family.kinds,
            node_id=node_id,
            states=state or [],
            limit=limit,
            offset=offset,
        )
        return admin.page.model_validate({"items": [family_job_view(family, job) for job in rows]})

    async def get(job_id: uuid.UUID, session: AdminTransaction) -> JobView:
        return family_job_view(family, await jobs.job_of(session, family, job_id))

    async def cancel(job_id: uuid.UUID, session: AdminTransaction) -> JobView:
        job = await jobs.job_of(session, family, job_id, lock=True)
        leases.request_cancel(session, job, await nodes.now(session), actor=OPERATOR_ACTOR)
        return family_job_view(family, job)

    one = admin.path + "/{job_id}"
    router.add_api_route(
        admin.path,
        listed,
        methods=["GET"],
        name=f"list_{name}_jobs",
        description=inspect.cleandoc(admin.listed),
        response_model=admin.page,
    )
    router.add_api_route(
        one,
        get,
        methods=["GET"],
        name=f"get_{name}_job",
        response_model=answer,
        responses=error_responses(404),
    )
    if admin.cancel is not None:
        router.add_api_route(
            one + "/cancel",
            cancel,
            methods=["POST"],
            name=f"cancel_{name}_job",
            description=inspect.cleandoc(admin.cancel),
            response_model=answer,
            responses=error_responses(404, 409),
        )
    return router
