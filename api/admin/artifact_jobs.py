"""Operator routes for artifact jobs: create (an acquisition), list, get, cancel (these
three from the family's declaration, api/admin/job_routes.py); the node's artifact
inventory, and an eviction from it. Included in the admin router, so the operator check
covers them (api/admin/routes.py)."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, status

from api.admin.job_routes import AdminJobs, job_routes
from api.admin.views import artifact_job_view
from api.deps import AdminTransaction, State
from api.errors import NotFound, error_responses
from schemas.artifacts import (
    ARTIFACT_FAMILY,
    ArtifactJobList,
    ArtifactKindView,
    CreateArtifactJob,
    CreateFromManifest,
    EvictArtifact,
    NodeArtifactList,
)
from schemas.events import OPERATOR_ACTOR
from schemas.protocol import ARTIFACT_JOBS, NODES
from store import artifacts
from store.models import Node

router = APIRouter()


@router.post(
    ARTIFACT_JOBS,
    status_code=status.HTTP_201_CREATED,
    # 502 and 503: a `resolve` whose source answers what we do not read, or cannot be reached.
    responses=error_responses(404, 409, 502, 503),
)
async def create_artifact_job(
    body: CreateArtifactJob, session: AdminTransaction, state: State
) -> ArtifactKindView:
    """Queue an acquisition for a node. With `resolve`, the control plane resolves the
    revision and patterns into an exact manifest first."""
    # Refusals first: nothing is asked of the source for a job that cannot be created.
    await artifacts.check_schedulable(session, body.node_id, body.target_root)
    if isinstance(body, CreateFromManifest):
        manifest = body.manifest
    else:
        manifest = await state.manifests.resolve(body.resolve)
    job = await artifacts.create(session, body, manifest, actor=OPERATOR_ACTOR)
    return artifact_job_view(job)


CANCEL = """A queued job ends cancelled at once; a claimed one is told on its next progress
report (409 once the job has ended)."""
router.include_router(
    job_routes(
        AdminJobs(
            ARTIFACT_FAMILY,
            ARTIFACT_JOBS,
            ArtifactJobList,
            cancel=CANCEL,
        )
    )
)


@router.post(
    NODES + "/{node_id}/artifacts/evict",
    status_code=status.HTTP_201_CREATED,
    responses=error_responses(404, 409),
)
async def evict_node_artifact(
    node_id: uuid.UUID, body: EvictArtifact, session: AdminTransaction
) -> ArtifactKindView:
    """Queue an eviction of one artifact of the node's inventory (artifact.evict.v1): the
    node deletes its files that still match the inventory's sizes and digests, under one
    of its roots and never through a symlink, and the artifact leaves the inventory. 404
    for an artifact the inventory does not hold; 409 while a deployment that has not
    ended, or a queued or leased job, uses it."""
    job = await artifacts.create_eviction(session, node_id, body, actor=OPERATOR_ACTOR)
    return artifact_job_view(job)


@router.get(NODES + "/{node_id}/artifacts", responses=error_responses(404))
async def list_node_artifacts(node_id: uuid.UUID, session: AdminTransaction) -> NodeArtifactList:
    """The node's artifact inventory: what completed jobs verified, and where."""
    if await session.get(Node, node_id) is None:
        raise NotFound(f"no node {node_id}")
    rows = await artifacts.node_artifacts(session, node_id)
    return NodeArtifactList.model_validate({"items": rows}, from_attributes=True)
