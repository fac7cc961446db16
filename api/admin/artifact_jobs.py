"""Operator routes for artifact jobs: create (an acquisition), list, get, cancel; the
node's artifact inventory, and an eviction from it. Included in the admin router, so
the operator check covers them (api/admin/routes.py)."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, status

from api.admin.views import artifact_job_view
from api.deps import AdminTransaction, State
from api.errors import NotFound, error_responses
from schemas.admin import PageLimit
from schemas.artifacts import (
    ARTIFACT_FAMILY,
    ArtifactFile,
    ArtifactJobList,
    ArtifactKindView,
    CreateArtifactJob,
    CreateFromManifest,
    EvictArtifact,
    NodeArtifact,
    NodeArtifactList,
)
from schemas.base import CountParam
from schemas.events import OPERATOR_ACTOR
from schemas.jobs import JobState
from schemas.protocol import ARTIFACT_JOBS, NODES
from store import artifacts, jobs, leases, nodes
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


@router.get(ARTIFACT_JOBS)
async def list_artifact_jobs(
    session: AdminTransaction,
    node_id: uuid.UUID | None = None,
    state: Annotated[list[JobState] | None, Query()] = None,
    limit: PageLimit = 100,
    offset: CountParam = 0,
) -> ArtifactJobList:
    rows = await leases.list_jobs(
        session,
        kind=ARTIFACT_FAMILY.kinds,
        node_id=node_id,
        states=state or [],
        limit=limit,
        offset=offset,
    )
    return ArtifactJobList(items=[artifact_job_view(job) for job in rows])


@router.get(ARTIFACT_JOBS + "/{job_id}", responses=error_responses(404))
async def get_artifact_job(job_id: uuid.UUID, session: AdminTransaction) -> ArtifactKindView:
    return artifact_job_view(await jobs.job_of(session, ARTIFACT_FAMILY, job_id))


@router.post(ARTIFACT_JOBS + "/{job_id}/cancel", responses=error_responses(404, 409))
async def cancel_artifact_job(job_id: uuid.UUID, session: AdminTransaction) -> ArtifactKindView:
    """A queued job ends cancelled at once; a claimed one is told on its next progress
    report (409 once the job has ended)."""
    job = await jobs.job_of(session, ARTIFACT_FAMILY, job_id, lock=True)
    leases.request_cancel(session, job, await nodes.now(session), actor=OPERATOR_ACTOR)
    return artifact_job_view(job)


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
    return NodeArtifactList(
        items=[
            NodeArtifact(
                node_id=row.node_id,
                root=row.root,
                repository=row.repository,
                commit=row.commit,
                files=[ArtifactFile.model_validate(f) for f in row.files],
                job_id=row.job_id,
                recorded_at=row.recorded_at,
            )
            for row in rows
        ]
    )
