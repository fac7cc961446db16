"""Service rules shared by the API and the workers: create, scale, roll out, undo and
delete a service (each one change of its row and its one event, in the caller's
transaction), and the views every reader shows (the API, the CLI, the dashboard).

The I/O a change needs (the artifact's revision resolved at the source, the GGUF header
read for the estimate) is the caller's, done before it calls here: these rules only read
and write PostgreSQL. The reconciler (store/services/reconcile.py) moves the replicas
towards what these rules declare; it holds the service's row lock for its whole step, and
so do these (`_locked`), so an operator's change and a reconciler's step never interleave.

Semantics the reconciler relies on:
* a rollout with a template identical to the current one (artifact, profile, environment
  and max_concurrent; the estimate is not compared) is refused 409 state_conflict: the
  generation moves only when what a replica runs changes;
* a rollout or an undo sets `previous_template`/`previous_generation` to the current
  ones, moves `generation` by one and sets the rollout `progressing` (reason "rollout"
  or "undo"); the reconciler marks it complete (or stopped). A rollout from a stopped
  one keeps the previous ones: the stopped template never served, the previous one
  still does;
* an undo swaps back to `previous_template` and relabels the live replicas of
  `previous_generation` with the new generation (they already run it, nothing is
  replaced); 409 without a previous template;
* a delete sets the state `deleting` (a second delete is answered with the same view and
  no event); the reconciler drains every replica and then marks it `deleted`;
* scale, rollout and undo are refused 409 unless the service is `active`.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Collection
from typing import Any, Final

from sqlalchemy import func, literal, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from schemas.errors import ErrorCode
from schemas.events import EventType
from schemas.runtime import LlamaSettings
from schemas.services import (
    LIVE_PHASES,
    Autoscale,
    MemoryEstimate,
    Placement,
    PlacementReceipt,
    ReplicaFailure,
    ReplicaPhase,
    ReplicaView,
    ResolvedArtifact,
    RolloutState,
    RolloutView,
    ServiceCreate,
    ServiceDetail,
    ServiceState,
    ServiceTemplate,
    ServiceView,
    UpdateStrategy,
)
from store import nodes, runtime
from store.errors import Conflict, Missing
from store.runtime_tables import RuntimeEnvironment, RuntimeProfile
from store.services.replicas import record
from store.services.tables import Service, ServiceReplica

# First key of the advisory lock that admits one live service per name: "mfsv".
_NAME_LOCK: Final = 0x6D667376
LIVE: Final = frozenset(phase.value for phase in LIVE_PHASES)
# The template's fields a rollout compares: what a replica runs.
_RUNS: Final = (
    "artifact",
    "profile_id",
    "profile_version",
    "environment_id",
    "max_concurrent",
    "endpoints",
)


# ------------------------------------------------------------------ what a change refers to


async def admitted_profile(
    session: AsyncSession, profile_id: uuid.UUID, endpoints: Collection[str]
) -> tuple[RuntimeProfile, LlamaSettings]:
    """The profile and its settings under today's allow-list, for a load serving
    `endpoints`: 404 profile_unknown (the request names it by id, as a path names an
    object: the OpenAPI contract's fuzzing takes a schema-valid id for valid, so a
    missing one is not the body's fault), or 422 server_flag_refused naming the flags
    (as a probe or a deployment is refused)."""
    profile = await session.get(RuntimeProfile, profile_id)
    if profile is None:
        raise Missing("no such runtime profile", code=ErrorCode.PROFILE_UNKNOWN)
    settings = runtime.admitted(profile)
    runtime.require_serves(profile, settings, endpoints)
    return profile, settings


async def check_environment(session: AsyncSession, environment_id: uuid.UUID | None) -> None:
    """None: the environment each node's runtime worker reports. 404 environment_unknown
    for an unknown one (as an unknown profile)."""
    if environment_id is not None and await session.get(RuntimeEnvironment, environment_id) is None:
        raise Missing("no such runtime environment", code=ErrorCode.ENVIRONMENT_UNKNOWN)


async def check_name_free(session: AsyncSession, name: str) -> None:
    """409 state_conflict while a service that is not deleted serves the name."""
    taken = (
        await session.execute(
            select(Service.id).where(Service.name == name, Service.state != ServiceState.DELETED)
        )
    ).scalar_one_or_none()
    if taken is not None:
        raise Conflict(
            f"a service named {name!r} exists already",
            code=ErrorCode.STATE_CONFLICT,
            extra={"service_id": str(taken)},
        )


# ------------------------------------------------------------------ changes


async def create(
    session: AsyncSession,
    request: ServiceCreate,
    artifact: ResolvedArtifact,
    estimate: MemoryEstimate | None,
    *,
    actor: str,
) -> Service:
    """An active service at generation 1, its rollout complete (no replica yet: the
    reconciler places them). One live service per name: creations of a name are
    serialised on an advisory lock on it, and the partial unique index
    (ux_services_live_name) refuses whatever would still slip past."""
    profile, _ = await admitted_profile(session, request.profile_id, request.endpoints)
    await check_environment(session, request.environment_id)
    await session.execute(
        select(func.pg_advisory_xact_lock(_NAME_LOCK, func.hashtext(literal(request.name))))
    )
    await check_name_free(session, request.name)
    now = await nodes.now(session)
    template = ServiceTemplate(
        artifact=artifact,
        profile_id=profile.id,
        profile_version=profile.version,
        environment_id=request.environment_id,
        max_concurrent=request.max_concurrent,
        estimate=estimate,
        endpoints=request.endpoints,
    )
    service = Service(
        id=uuid.uuid4(),
        name=request.name,
        roles=list(request.roles),
        state=ServiceState.ACTIVE.value,
        template=template.model_dump(mode="json"),
        endpoints=list(template.endpoints),
        previous_template=None,
        previous_generation=None,
        generation=1,
        replicas=_clamped(request.replicas, request.autoscale),
        autoscale=request.autoscale.model_dump(mode="json") if request.autoscale else None,
        placement=request.placement.model_dump(mode="json"),
        strategy=request.strategy.model_dump(mode="json"),
        rollout_state=RolloutState.COMPLETE.value,
        rollout_reason=None,
        rollout_started_at=None,
        last_receipt=None,
        backoff={},
        scaled_at=None,
        created_at=now,
        updated_at=now,
    )
    session.add(service)
    try:
        await session.flush()
    except IntegrityError:
        raise Conflict(
            f"a service named {request.name!r} exists already", code=ErrorCode.STATE_CONFLICT
        ) from None
    record(session, service, "created", actor=actor, event_type=EventType.SERVICE_CREATED)
    return service


async def scale(
    session: AsyncSession, service_id: uuid.UUID, replicas: int, *, actor: str
) -> Service:
    """The desired count (clamped to autoscale's bounds when it is on; autoscale moves it
    from there after its cooldown). The same count again changes nothing and records
    nothing."""
    service = await _active(session, service_id)
    autoscale = Autoscale.model_validate(service.autoscale) if service.autoscale else None
    wanted = _clamped(replicas, autoscale)
    if wanted == service.replicas:
        return service
    now = await nodes.now(session)
    service.replicas = wanted
    service.updated_at = now
    # An operator's count starts autoscale's cooldown, so it is not undone at once.
    service.scaled_at = now
    record(session, service, "scaled", actor=actor)
    return service


async def rollout(
    session: AsyncSession,
    service_id: uuid.UUID,
    template: ServiceTemplate,
    *,
    actor: str,
    based_on: int | None = None,
) -> Service:
    """A new template, rolled out one replica at a time by the reconciler. 409 when it
    would run what the current one runs, or when `based_on` (the generation whose
    template the new one was built from, before this lock: the API asks the source in
    between) is no longer the current one: another rollout or an undo committed since,
    and this template would silently revert what it changed."""
    service = await _active(session, service_id)
    if based_on is not None and service.generation != based_on:
        raise Conflict(
            f"the service's template changed since this rollout read it (generation"
            f" {based_on}, now {service.generation}); retry on the current one",
            code=ErrorCode.STATE_CONFLICT,
            extra={"generation": service.generation},
        )
    current = ServiceTemplate.model_validate(service.template)
    if _runs(current) == _runs(template):
        raise Conflict(
            "the rollout changes nothing a replica runs (the revision resolves to the"
            " commit the service already runs, and the rest is the same)",
            code=ErrorCode.STATE_CONFLICT,
            extra={"generation": service.generation},
        )
    # A stopped rollout's template never served (its new replica failed; the previous
    # generation's replicas still do): it must not become the previous one, which the
    # reconciler heals with while a rollout is stopped and an undo goes back to.
    keep = service.rollout_state == RolloutState.STOPPED and service.previous_template is not None
    await _next_generation(session, service, template, "rollout", actor=actor, keep_previous=keep)
    return service


async def undo(session: AsyncSession, service_id: uuid.UUID, *, actor: str) -> Service:
    """Back to the previous template, as a new generation; the live replicas that run it
    (the previous generation's) are relabelled, not replaced. 409 without one."""
    service = await _active(session, service_id)
    if service.previous_template is None or service.previous_generation is None:
        raise Conflict("the service has no previous template", code=ErrorCode.STATE_CONFLICT)
    back = ServiceTemplate.model_validate(service.previous_template)
    runs_back = service.previous_generation
    await _next_generation(session, service, back, "undo", actor=actor)
    await session.execute(
        update(ServiceReplica)
        .where(
            ServiceReplica.service_id == service.id,
            ServiceReplica.generation == runs_back,
            ServiceReplica.phase.in_(LIVE),
        )
        .values(generation=service.generation, updated_at=service.updated_at)
    )
    return service


async def delete(session: AsyncSession, service_id: uuid.UUID, *, actor: str) -> Service:
    """Every replica drains, then the reconciler marks the service deleted (its name is
    free from then). Again while deleting: the same answer, no second event; 409 once
    deleted."""
    service = await _locked(session, service_id)
    if service.state == ServiceState.DELETING:
        return service
    if service.state == ServiceState.DELETED:
        raise Conflict("the service is deleted", code=ErrorCode.STATE_CONFLICT)
    service.state = ServiceState.DELETING.value
    service.updated_at = await nodes.now(session)
    record(session, service, "deleting", actor=actor)
    return service


# ------------------------------------------------------------------ reads


def require_active(service: Service) -> None:
    """409 state_conflict for a service deleting or deleted: it is scaled, rolled out
    and undone only while active."""
    if service.state != ServiceState.ACTIVE:
        raise Conflict(
            f"the service is {service.state}",
            code=ErrorCode.STATE_CONFLICT,
            extra={"state": service.state},
        )


async def get(session: AsyncSession, service_id: uuid.UUID) -> Service:
    service = await session.get(Service, service_id)
    if service is None:
        raise Missing(f"no service {service_id}", code=ErrorCode.NOT_FOUND)
    return service


async def listed(
    session: AsyncSession,
    *,
    states: list[ServiceState],
    name: str | None,
    limit: int,
    offset: int,
) -> list[Service]:
    query = select(Service)
    if states:
        query = query.where(Service.state.in_([s.value for s in states]))
    if name is not None:
        query = query.where(Service.name == name)
    query = query.order_by(Service.created_at.desc(), Service.id).limit(limit).offset(offset)
    return list((await session.execute(query)).scalars().all())


async def replicas_of(
    session: AsyncSession, service_id: uuid.UUID, *, ended: int = 0
) -> list[ServiceReplica]:
    """The live replicas (bounded by the replicas a service may ask for, plus its
    surge), then the `ended` newest ended ones: a service that healed for months has
    ended replicas without bound, and a page reads this on every one of its events."""
    mine = select(ServiceReplica).where(ServiceReplica.service_id == service_id)
    order = (ServiceReplica.created_at, ServiceReplica.id)
    live = await session.execute(mine.where(ServiceReplica.phase.in_(LIVE)).order_by(*order))
    rows = list(live.scalars().all())
    if ended > 0:
        newest = (
            mine.where(ServiceReplica.phase.not_in(LIVE))
            .order_by(ServiceReplica.created_at.desc(), ServiceReplica.id)
            .limit(ended)
        )
        rows += list((await session.execute(newest)).scalars().all())
    return rows


# ------------------------------------------------------------------ views


async def views(session: AsyncSession, services: list[Service]) -> list[ServiceView]:
    """Each service with its replicas counted (one query for the page)."""
    counts = await _counts(session, [s.id for s in services])
    return [view(s, counts.get(s.id, Counter())) for s in services]


async def detail(session: AsyncSession, service: Service, *, ended: int = 0) -> ServiceDetail:
    [shown] = await views(session, [service])
    rows = await replicas_of(session, service.id, ended=ended)
    return ServiceDetail(**shown.model_dump(), items=[replica_view(replica) for replica in rows])


def view(service: Service, counts: Counter[tuple[int, str]]) -> ServiceView:
    """counts: the service's live replicas by (generation, phase)."""
    ready = sum(n for (_, phase), n in counts.items() if phase == ReplicaPhase.READY)
    updated_ready = counts[(service.generation, ReplicaPhase.READY.value)]
    outdated = sum(n for (generation, _), n in counts.items() if generation != service.generation)
    receipt = service.last_receipt
    return ServiceView(
        id=service.id,
        name=service.name,
        roles=list(service.roles),
        state=ServiceState(service.state),
        template=ServiceTemplate.model_validate(service.template),
        generation=service.generation,
        replicas=service.replicas,
        ready_replicas=ready,
        autoscale=Autoscale.model_validate(service.autoscale) if service.autoscale else None,
        placement=Placement.model_validate(service.placement),
        strategy=UpdateStrategy.model_validate(service.strategy),
        rollout=RolloutView(
            state=RolloutState(service.rollout_state),
            generation=service.generation,
            updated_ready=updated_ready,
            desired=service.replicas,
            outdated=outdated,
            reason=service.rollout_reason,
            started_at=service.rollout_started_at,
        ),
        last_receipt=PlacementReceipt.model_validate(receipt) if receipt else None,
        created_at=service.created_at,
        updated_at=service.updated_at,
    )


def replica_view(replica: ServiceReplica) -> ReplicaView:
    failure = (
        ReplicaFailure(code=replica.failure_code, detail=replica.failure_detail or "")
        if replica.failure_code
        else None
    )
    return ReplicaView(
        id=replica.id,
        service_id=replica.service_id,
        generation=replica.generation,
        node_id=replica.node_id,
        device_id=replica.device_id,
        phase=ReplicaPhase(replica.phase),
        artifact_job_id=replica.artifact_job_id,
        deployment_id=replica.deployment_id,
        receipt=PlacementReceipt.model_validate(replica.receipt) if replica.receipt else None,
        failure=failure,
        ended_reason=replica.ended_reason,
        created_at=replica.created_at,
        phase_changed_at=replica.phase_changed_at,
    )


# ------------------------------------------------------------------ helpers


def _clamped(replicas: int, autoscale: Autoscale | None) -> int:
    if autoscale is None:
        return replicas
    return max(autoscale.min_replicas, min(autoscale.max_replicas, replicas))


def _runs(template: ServiceTemplate) -> dict[str, Any]:
    return template.model_dump(mode="json", include=set(_RUNS))


async def _locked(session: AsyncSession, service_id: uuid.UUID) -> Service:
    """The row under its lock, as the reconciler holds it for its step."""
    service = await session.get(Service, service_id, with_for_update=True, populate_existing=True)
    if service is None:
        raise Missing(f"no service {service_id}", code=ErrorCode.NOT_FOUND)
    return service


async def _active(session: AsyncSession, service_id: uuid.UUID) -> Service:
    service = await _locked(session, service_id)
    require_active(service)
    return service


async def _next_generation(
    session: AsyncSession,
    service: Service,
    template: ServiceTemplate,
    reason: str,
    *,
    actor: str,
    keep_previous: bool = False,
) -> None:
    now = await nodes.now(session)
    if not keep_previous:
        service.previous_template = service.template
        service.previous_generation = service.generation
    service.template = template.model_dump(mode="json")
    service.endpoints = list(template.endpoints)
    service.generation += 1
    service.rollout_state = RolloutState.PROGRESSING.value
    service.rollout_reason = reason
    service.rollout_started_at = now
    service.updated_at = now
    record(session, service, reason, actor=actor)


async def _counts(
    session: AsyncSession, service_ids: list[uuid.UUID]
) -> dict[uuid.UUID, Counter[tuple[int, str]]]:
    if not service_ids:
        return {}
    rows = await session.execute(
        select(
            ServiceReplica.service_id,
            ServiceReplica.generation,
            ServiceReplica.phase,
            func.count(),
        )
        .where(ServiceReplica.service_id.in_(service_ids), ServiceReplica.phase.in_(LIVE))
        .group_by(ServiceReplica.service_id, ServiceReplica.generation, ServiceReplica.phase)
    )
    counts: dict[uuid.UUID, Counter[tuple[int, str]]] = {}
    for service_id, generation, phase, count in rows:
        counts.setdefault(service_id, Counter())[(generation, phase)] = count
    return counts
