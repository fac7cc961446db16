"""Operator routes for the runtime: profiles (immutable versions), environments (the
binaries nodes reported), runtime jobs of every kind (create, list, get, cancel; shown
through the one job view, api/admin/views.py), probe evidence, and a node's last
runtime report. Included in the admin router (operator check)."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, status

from api.admin.views import runtime_job_view
from api.deps import AdminTransaction
from api.errors import NotFound, error_responses
from schemas.admin import PageLimit
from schemas.base import CountParam
from schemas.events import OPERATOR_ACTOR
from schemas.jobs import JobState
from schemas.protocol import (
    NODES,
    RUNTIME_ENVIRONMENTS,
    RUNTIME_EVIDENCE,
    RUNTIME_JOBS,
    RUNTIME_PROFILES,
)
from schemas.runtime import (
    RUNTIME_FAMILY,
    EvidenceList,
    EvidenceView,
    ProbeCreate,
    ProbeEvidence,
    ProfileCreate,
    ProfileName,
    RuntimeEnvironmentList,
    RuntimeEnvironmentView,
    RuntimeJobCreate,
    RuntimeJobList,
    RuntimeJobView,
    RuntimeKindView,
    RuntimeProfileList,
    RuntimeProfileView,
    ServerHealth,
)
from schemas.runtime_local import NodeRuntimeView
from store import jobs, leases, nodes, runtime
from store.models import Node
from store.runtime_tables import RuntimeEnvironment, RuntimeProfile

router = APIRouter()


def profile_view(profile: RuntimeProfile) -> RuntimeProfileView:
    return RuntimeProfileView(
        id=profile.id,
        name=profile.name,
        version=profile.version,
        settings=profile.settings,
        created_at=profile.created_at,
    )


def environment_view(environment: RuntimeEnvironment) -> RuntimeEnvironmentView:
    return RuntimeEnvironmentView(
        id=environment.id,
        binary_sha256=environment.binary_sha256,
        version=environment.version,
        backend=environment.backend,
        first_reported_at=environment.first_reported_at,
        first_node_id=environment.first_node_id,
    )


@router.post(RUNTIME_PROFILES, status_code=status.HTTP_201_CREATED, responses=error_responses(409))
async def create_runtime_profile(
    body: ProfileCreate, session: AdminTransaction
) -> RuntimeProfileView:
    """The next version of the named profile; earlier versions stay as they were."""
    profile = await runtime.create_profile(session, body.name, body.settings, actor=OPERATOR_ACTOR)
    return profile_view(profile)


@router.get(RUNTIME_PROFILES)
async def list_runtime_profiles(
    session: AdminTransaction,
    name: ProfileName | None = None,
) -> RuntimeProfileList:
    return RuntimeProfileList(
        items=[profile_view(p) for p in await runtime.profiles(session, name)]
    )


@router.get(RUNTIME_PROFILES + "/{profile_id}", responses=error_responses(404))
async def get_runtime_profile(
    profile_id: uuid.UUID, session: AdminTransaction
) -> RuntimeProfileView:
    profile = await session.get(RuntimeProfile, profile_id)
    if profile is None:
        raise NotFound(f"no runtime profile {profile_id}")
    return profile_view(profile)


@router.get(RUNTIME_ENVIRONMENTS)
async def list_runtime_environments(session: AdminTransaction) -> RuntimeEnvironmentList:
    rows = await runtime.environments(session)
    return RuntimeEnvironmentList(items=[environment_view(e) for e in rows])


@router.post(
    RUNTIME_JOBS,
    status_code=status.HTTP_201_CREATED,
    response_model=RuntimeJobView,
    responses=error_responses(404, 409),
)
async def create_runtime_job(body: RuntimeJobCreate, session: AdminTransaction) -> RuntimeKindView:
    """A runtime.probe.v1 job (the default kind): the artifact resolved from the node's
    artifact inventory, the profile and environment by identity, the fixed probe input.
    Or, by `kind`, a runtime.health.v1 or runtime.unload.v1 job for one device."""
    if isinstance(body, ProbeCreate):
        job = await runtime.create_probe(session, body, actor=OPERATOR_ACTOR)
    else:
        job = await runtime.create_device_job(session, body, actor=OPERATOR_ACTOR)
    return runtime_job_view(job)


@router.get(RUNTIME_JOBS)
async def list_runtime_jobs(
    session: AdminTransaction,
    node_id: uuid.UUID | None = None,
    state: Annotated[list[JobState] | None, Query()] = None,
    limit: PageLimit = 100,
    offset: CountParam = 0,
) -> RuntimeJobList:
    """Runtime jobs of every kind, newest first."""
    rows = await leases.list_jobs(
        session,
        kind=RUNTIME_FAMILY.kinds,
        node_id=node_id,
        states=state or [],
        limit=limit,
        offset=offset,
    )
    return RuntimeJobList(items=[runtime_job_view(job) for job in rows])


@router.get(
    RUNTIME_JOBS + "/{job_id}", response_model=RuntimeJobView, responses=error_responses(404)
)
async def get_runtime_job(job_id: uuid.UUID, session: AdminTransaction) -> RuntimeKindView:
    return runtime_job_view(await jobs.job_of(session, RUNTIME_FAMILY, job_id))


@router.post(
    RUNTIME_JOBS + "/{job_id}/cancel",
    response_model=RuntimeJobView,
    responses=error_responses(404, 409),
)
async def cancel_runtime_job(job_id: uuid.UUID, session: AdminTransaction) -> RuntimeKindView:
    job = await jobs.job_of(session, RUNTIME_FAMILY, job_id, lock=True)
    leases.request_cancel(session, job, await nodes.now(session), actor=OPERATOR_ACTOR)
    return runtime_job_view(job)


@router.get(RUNTIME_EVIDENCE)
async def list_runtime_evidence(
    session: AdminTransaction, node_id: uuid.UUID | None = None
) -> EvidenceList:
    """The latest evidence per (node, device, artifact, profile, environment)."""
    rows = await runtime.evidence(session, node_id)
    return EvidenceList(
        items=[
            EvidenceView(
                node_id=row.node_id,
                device_id=row.device_id,
                artifact_digest=row.artifact_digest,
                artifact_path=row.artifact_path,
                profile_id=row.profile_id,
                environment_id=row.environment_id,
                health=ServerHealth.model_validate(row.health),
                evidence=ProbeEvidence.model_validate(row.evidence),
                job_id=row.job_id,
                recorded_at=row.recorded_at,
            )
            for row in rows
        ]
    )


@router.get(NODES + "/{node_id}/runtime", responses=error_responses(404))
async def get_node_runtime(node_id: uuid.UUID, session: AdminTransaction) -> NodeRuntimeView:
    """The node's last applied runtime report (devices, served and loaded models, queue
    depths, binaries); empty until its runtime worker reports."""
    if await session.get(Node, node_id) is None:
        raise NotFound(f"no node {node_id}")
    report = await runtime.node_runtime(session, node_id)
    if report is None:
        return NodeRuntimeView(devices=[], served_models=[], loaded_models=[], reported=False)
    return NodeRuntimeView.model_validate({**report, "reported": True})
