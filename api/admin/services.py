"""Operator routes for model services (schemas/services.py): create, list, get, scale,
roll out (and its status, and its undo), delete. Included in the admin router (operator
check); the rules are in store/services/rules.py, the replicas are the reconciler's.

A create or a rollout asks the artifact source first (the revision resolved to an exact
commit, the file's size and digest, as an artifact job's manifest is; then the GGUF
header for the memory estimate) in a short read of its own refusals before, so no
database connection waits on the source and nothing is asked of it for a change that
would be refused. An unreadable header is no failure: the estimate falls back to the
file's size, so a service is created from a source that serves no ranges too."""

from __future__ import annotations

import logging
import uuid
from typing import Annotated

from fastapi import APIRouter, Query, status
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncSession

from api.deps import AdminTransaction, State
from api.errors import BadGateway, error_responses
from api.manifests import Unresolvable
from api.state import ApiState
from schemas.admin import PageLimit
from schemas.artifacts import DigestAlgorithm, ManifestRequest
from schemas.base import CountParam
from schemas.deployments import ServedModel
from schemas.events import OPERATOR_ACTOR
from schemas.protocol import SERVICES
from schemas.runtime import LlamaSettings
from schemas.services import (
    MemoryEstimate,
    ResolvedArtifact,
    RolloutView,
    ServiceArtifact,
    ServiceCreate,
    ServiceDetail,
    ServiceList,
    ServiceRollout,
    ServiceScale,
    ServiceState,
    ServiceTemplate,
)
from store.services import rules as services
from store.services.estimate import estimate

router = APIRouter()
# Past any device's memory (16 TiB): a source claiming more is refused (502).
MAX_MODEL_BYTES = 2**44

logger = logging.getLogger("modelforge.api.admin.services")
MISSING = error_responses(404)
MISSING_OR_CONFLICT = error_responses(404, 409)
# 502 and 503: a source that answers what we do not read, or cannot be reached.
SOURCED = error_responses(404, 409, 502, 503)


@router.post(SERVICES, status_code=status.HTTP_201_CREATED, responses=SOURCED)
async def create_service(
    body: ServiceCreate, session: AdminTransaction, state: State
) -> ServiceDetail:
    """Declare a service: its artifact's revision is resolved once to an exact commit
    (422 when the source has no such repository, revision or file), the profile known
    (404 profile_unknown, as an unknown environment) and admitted by the allow-list
    (422), the name free among services not deleted (409). The reconciler places its
    replicas; the answer has none yet."""
    async with state.sessions() as read:
        _, settings = await services.admitted_profile(read, body.profile_id, body.endpoints)
        await services.check_environment(read, body.environment_id)
        await services.check_name_free(read, body.name)
    artifact, summary_estimate = await _sourced(state, body.artifact, settings)
    service = await services.create(session, body, artifact, summary_estimate, actor=OPERATOR_ACTOR)
    return await services.detail(session, service)


@router.get(SERVICES)
async def list_services(
    session: AdminTransaction,
    state: Annotated[list[ServiceState] | None, Query()] = None,
    name: ServedModel | None = None,
    limit: PageLimit = 100,
    offset: CountParam = 0,
) -> ServiceList:
    """Newest first, with their replicas counted."""
    rows = await services.listed(session, states=state or [], name=name, limit=limit, offset=offset)
    return ServiceList(items=await services.views(session, rows))


@router.get(SERVICES + "/{service_id}", responses=MISSING)
async def get_service(
    service_id: uuid.UUID,
    session: AdminTransaction,
    ended: bool = False,
    ended_limit: PageLimit = 100,
) -> ServiceDetail:
    """The service and its live replicas (with `ended`, the `ended_limit` newest ended
    ones too)."""
    shown = ended_limit if ended else 0
    return await services.detail(session, await services.get(session, service_id), ended=shown)


@router.post(SERVICES + "/{service_id}/scale", responses=MISSING_OR_CONFLICT)
async def scale_service(
    service_id: uuid.UUID, body: ServiceScale, session: AdminTransaction
) -> ServiceDetail:
    """The desired count; with autoscale on, clamped to its bounds. 409 unless active."""
    service = await services.scale(session, service_id, body.replicas, actor=OPERATOR_ACTOR)
    return await services.detail(session, service)


@router.post(SERVICES + "/{service_id}/rollout", responses=SOURCED)
async def roll_out_service(
    service_id: uuid.UUID, body: ServiceRollout, session: AdminTransaction, state: State
) -> ServiceDetail:
    """A new template from what the body names (the rest kept), replacing replicas one
    at a time. A new revision is resolved again; the estimate is made again when the
    artifact or the profile changes. 409 unless active, or when the template would run
    what the current one runs (e.g. a revision that still resolves to the same commit),
    or when another rollout or an undo committed while this one asked the source."""
    template, based_on = await _next_template(state, service_id, body)
    service = await services.rollout(
        session, service_id, template, actor=OPERATOR_ACTOR, based_on=based_on
    )
    return await services.detail(session, service)


@router.get(SERVICES + "/{service_id}/rollout", responses=MISSING)
async def rollout_status(service_id: uuid.UUID, session: AdminTransaction) -> RolloutView:
    """The rollout's progress: ready replicas of the current generation out of those
    desired, and live ones of older generations."""
    [shown] = await services.views(session, [await services.get(session, service_id)])
    return shown.rollout


@router.post(SERVICES + "/{service_id}/rollout/undo", responses=MISSING_OR_CONFLICT)
async def undo_rollout(service_id: uuid.UUID, session: AdminTransaction) -> ServiceDetail:
    """Back to the previous template, as a new generation: the replicas still running
    it are kept as they are. 409 when there is none, or unless active."""
    service = await services.undo(session, service_id, actor=OPERATOR_ACTOR)
    return await services.detail(session, service)


@router.delete(
    SERVICES + "/{service_id}",
    status_code=status.HTTP_202_ACCEPTED,
    responses=MISSING_OR_CONFLICT,
)
async def delete_service(service_id: uuid.UUID, session: AdminTransaction) -> ServiceDetail:
    """Every replica drains (its streams finish within the strategy's drain deadline),
    then the service is deleted and its name free. Accepted: `deleting` until then; 409
    once deleted."""
    service = await services.delete(session, service_id, actor=OPERATOR_ACTOR)
    return await services.detail(session, service)


# ------------------------------------------------------------------ the source


async def _sourced(
    state: ApiState, artifact: ServiceArtifact, settings: LlamaSettings
) -> tuple[ResolvedArtifact, MemoryEstimate]:
    resolved = await _resolve(state, artifact)
    return resolved, await _estimate(state, resolved, settings)


async def _resolve(state: ApiState, artifact: ServiceArtifact) -> ResolvedArtifact:
    """The revision's exact commit and the file's size (and sha256 when the source gives
    one), through the manifest resolver artifact jobs use."""
    try:
        request = ManifestRequest(
            repository=artifact.repository,
            revision=artifact.revision,
            patterns=[_literal(artifact.path)],
        )
    except ValidationError:
        raise Unresolvable("the file's path cannot be looked up at the source") from None
    manifest = await state.manifests.resolve(request)
    found = [f for f in manifest.files if f.path == artifact.path]
    if not found:
        raise Unresolvable("the source has no such file at that revision")
    file = found[0]
    sha256 = file.digest.value if file.digest.algorithm == DigestAlgorithm.SHA256 else None
    return ResolvedArtifact(
        repository=artifact.repository,
        revision=artifact.revision,
        commit=manifest.commit,
        path=artifact.path,
        size_bytes=file.size,
        sha256=sha256,
    )


async def _estimate(
    state: ApiState, artifact: ResolvedArtifact, settings: LlamaSettings
) -> MemoryEstimate:
    if artifact.size_bytes > MAX_MODEL_BYTES:
        # A file the source says is petabytes: no device holds it, and no estimate of it
        # means anything. The source's answer is what is wrong.
        raise BadGateway(
            f"the artifact source claims a file of {artifact.size_bytes} bytes, past any device"
        )
    # None when the header cannot be read (the source serves no ranges, not a GGUF):
    # the estimate is the file's size then.
    summary = await state.model_headers.summary(artifact.repository, artifact.commit, artifact.path)
    if summary is not None:
        try:
            return estimate(summary, artifact.size_bytes, settings)
        except ValueError as exc:
            # The header is the source's, untrusted: values no model has (a tensor of
            # 2^64 elements a side, a negative layer count, a trained context of 2^63)
            # give an estimate the wire cannot carry. A header we cannot use, then.
            logger.warning(
                "GGUF header of %s@%s:%s gives no estimate: %s",
                artifact.repository,
                artifact.commit,
                artifact.path,
                type(exc).__name__,
            )
    return estimate(None, artifact.size_bytes, settings)


def _literal(path: str) -> str:
    """The path as a pattern that matches only itself (fnmatch's brackets quote)."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in path)


async def _next_template(
    state: ApiState, service_id: uuid.UUID, body: ServiceRollout
) -> tuple[ServiceTemplate, int]:
    """What the rollout would run: the current template with what the body names; and
    the generation it was read at (the rollout is refused if it moved meanwhile)."""
    async with state.sessions() as read:
        current, generation = await _current(read, service_id)
        profile_id = body.profile_id or current.profile_id
        endpoints = body.endpoints or current.endpoints
        profile, settings = await services.admitted_profile(read, profile_id, endpoints)
        environment_id = current.environment_id
        if "environment_id" in body.model_fields_set:
            environment_id = body.environment_id
            await services.check_environment(read, environment_id)
    artifact = current.artifact
    if body.artifact is not None:
        artifact = await _resolve(state, body.artifact)
    template = current.model_copy(
        update={
            "artifact": artifact,
            "profile_id": profile.id,
            "profile_version": profile.version,
            "environment_id": environment_id,
            "max_concurrent": body.max_concurrent or current.max_concurrent,
            "endpoints": endpoints,
        }
    )
    if artifact != current.artifact or profile.id != current.profile_id:
        template = template.model_copy(
            update={"estimate": await _estimate(state, artifact, settings)}
        )
    return template, generation


async def _current(session: AsyncSession, service_id: uuid.UUID) -> tuple[ServiceTemplate, int]:
    service = await services.get(session, service_id)
    services.require_active(service)
    return ServiceTemplate.model_validate(service.template), service.generation
