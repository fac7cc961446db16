"""Operator routes for deployments: create, list, get, drain and unload, and the jobs
that move them (a deployment's here; every deployment job's list and get from the
family's declaration, api/admin/job_routes.py). Included in the admin router (operator
check); the rules are in store/deployments/rules.py."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, status

from api.admin.job_routes import AdminJobs, job_routes
from api.admin.views import deployment_job_view, deployment_view
from api.deps import AdminTransaction
from api.errors import error_responses
from schemas.admin import PageLimit
from schemas.base import CountParam
from schemas.deployments import (
    DEPLOYMENT_FAMILY,
    DeploymentCreate,
    DeploymentDrain,
    DeploymentJobList,
    DeploymentList,
    DeploymentState,
    DeploymentView,
    ServedModel,
)
from schemas.events import OPERATOR_ACTOR
from schemas.protocol import DEPLOYMENT_JOBS, DEPLOYMENTS
from store.deployments import rules as deployments

router = APIRouter()
MISSING = error_responses(404)
MISSING_OR_CONFLICT = error_responses(404, 409)


@router.post(DEPLOYMENTS, status_code=status.HTTP_201_CREATED, responses=error_responses(404, 409))
async def create_deployment(body: DeploymentCreate, session: AdminTransaction) -> DeploymentView:
    """A pending deployment and its deployment.load.v1 job: the artifact resolved from
    the node's artifact inventory, the profile admitted, the device one the node's
    runtime worker reports (422 otherwise)."""
    return deployment_view(await deployments.create(session, body, actor=OPERATOR_ACTOR))


@router.get(DEPLOYMENTS)
async def list_deployments(
    session: AdminTransaction,
    node_id: uuid.UUID | None = None,
    state: Annotated[list[DeploymentState] | None, Query()] = None,
    model: ServedModel | None = None,
    limit: PageLimit = 100,
    offset: CountParam = 0,
) -> DeploymentList:
    """Newest first; `cooldown_until` says the gateway is not routing to one for now."""
    rows = await deployments.listed(
        session, node_id=node_id, states=state or [], model=model, limit=limit, offset=offset
    )
    return DeploymentList(items=[deployment_view(d) for d in rows])


@router.get(DEPLOYMENTS + "/{deployment_id}", responses=MISSING)
async def get_deployment(deployment_id: uuid.UUID, session: AdminTransaction) -> DeploymentView:
    return deployment_view(await deployments.get(session, deployment_id))


@router.post(DEPLOYMENTS + "/{deployment_id}/drain", responses=MISSING_OR_CONFLICT)
async def drain_deployment(
    deployment_id: uuid.UUID, body: DeploymentDrain, session: AdminTransaction
) -> DeploymentView:
    """New invokes stop at once; invokes in flight finish, up to `deadline_s`; then the
    model is unloaded. 409 for a deployment that already ended."""
    deployment = await deployments.drain(
        session, deployment_id, body.deadline_s, actor=OPERATOR_ACTOR
    )
    return deployment_view(deployment)


@router.post(DEPLOYMENTS + "/{deployment_id}/unload", responses=MISSING_OR_CONFLICT)
async def unload_deployment(deployment_id: uuid.UUID, session: AdminTransaction) -> DeploymentView:
    """A drain with a deadline of 0, from any state that has not ended: it queues a
    deployment.unload.v1 job (no drain job), and invokes in flight are cut at once."""
    deployment = await deployments.drain(session, deployment_id, 0.0, actor=OPERATOR_ACTOR)
    return deployment_view(deployment)


@router.get(DEPLOYMENTS + "/{deployment_id}/jobs", responses=MISSING)
async def list_jobs_of_deployment(
    deployment_id: uuid.UUID, session: AdminTransaction
) -> DeploymentJobList:
    """Every job that moved this deployment, newest first."""
    await deployments.get(session, deployment_id)
    rows = await deployments.jobs_of(session, deployment_id)
    return DeploymentJobList(items=[deployment_job_view(job) for job in rows])


# A deployment's jobs are cancelled by draining or unloading it, never one by one.
router.include_router(
    job_routes(
        AdminJobs(
            DEPLOYMENT_FAMILY,
            DEPLOYMENT_JOBS,
            DeploymentJobList,
            listed="Deployment jobs of every kind, newest first.",
            cancel=None,
        )
    )
)
