"""Operator routes for the runtime: profiles (immutable versions), environments (the
binaries nodes reported), runtime jobs of every kind (create here; list, get and cancel
from the family's declaration, api/admin/job_routes.py), probe evidence, and a node's
last runtime report. Included in the admin router (operator check)."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, status

from api.admin.job_routes import AdminJobs, job_routes
from api.admin.views import runtime_job_view
from api.deps import AdminTransaction
from api.errors import NotFound, error_responses
from schemas.events import OPERATOR_ACTOR
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
    ProbeCreate,
    ProfileCreate,
    ProfileName,
    RuntimeEnvironmentList,
    RuntimeJobCreate,
    RuntimeJobList,
    RuntimeJobView,
    RuntimeKindView,
    RuntimeProfileList,
    RuntimeProfileView,
)
from schemas.runtime_local import NodeRuntimeView
from store import runtime
from store.models import Node
from store.runtime_tables import RuntimeProfile

router = APIRouter()


def profile_view(profile: RuntimeProfile) -> RuntimeProfileView:
    return RuntimeProfileView.model_validate(profile, from_attributes=True)


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
    rows = await runtime.profiles(session, name)
    return RuntimeProfileList.model_validate({"items": rows}, from_attributes=True)


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
    return RuntimeEnvironmentList.model_validate({"items": rows}, from_attributes=True)


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


router.include_router(
    job_routes(
        AdminJobs(
            RUNTIME_FAMILY,
            RUNTIME_JOBS,
            RuntimeJobList,
            listed="Runtime jobs of every kind, newest first.",
        )
    )
)


@router.get(RUNTIME_EVIDENCE)
async def list_runtime_evidence(
    session: AdminTransaction, node_id: uuid.UUID | None = None
) -> EvidenceList:
    """The latest evidence per (node, device, artifact, profile, environment)."""
    rows = await runtime.evidence(session, node_id)
    return EvidenceList.model_validate({"items": rows}, from_attributes=True)


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
