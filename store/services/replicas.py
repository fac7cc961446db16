"""A service's replicas, one step at a time (the reconciler, store/services/reconcile.py,
decides which step): start one on a placed receipt, follow it through its artifact job
and its deployment, drain it, end it. Every phase change writes the row and one
service.replica_changed event (action: the new phase) in the caller's transaction.

A replica is nothing new on the node: an artifact job created as an operator's would be
(its own lease, fencing and retries) when the chosen node lacks the file, then a
deployment created through store/deployments/rules.py: create. A failure of either ends
the replica and backs the service off that node (exponential per node, capped), so the
next placement goes elsewhere.

Locks: the caller holds the service's row. Everything here that touches a node's rows
goes through the rules that take the node's lock first (store/locks.py): the agent
routes never lock a service, so service → node → job → deployment cannot deadlock with
them. A new replica's node is only tried (try_lock_node): see store/locks.py for why.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from sqlalchemy import select
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from schemas.artifacts import ArtifactFile, ArtifactManifest, JobTarget, Sha256Digest
from schemas.deployments import DeploymentCreate
from schemas.errors import ErrorCode
from schemas.events import EventType
from schemas.runtime import ArtifactRef
from schemas.services import (
    LIVE_PHASES,
    PlacementReceipt,
    ReplicaFailure,
    ReplicaPhase,
    ServiceEvent,
    ServiceTemplate,
)
from store import artifacts, changes, leases, nodes, runtime
from store.deployments import rules as deployments
from store.errors import StoreError
from store.locks import node_try_xact_lock
from store.models import Job, Node
from store.runtime_tables import RuntimeEnvironment
from store.services.tables import Service, ServiceReplica

LIVE: Final = frozenset(phase.value for phase in LIVE_PHASES)
# Attempts of a replica's artifact job and of its deployment's load (each with the
# job's own backoff) before the replica fails and moves elsewhere.
ACQUIRE_ATTEMPTS: Final = 3
LOAD_ATTEMPTS: Final = 3
# PostgreSQL's lock_not_available (FOR UPDATE NOWAIT refused).
LOCK_NOT_AVAILABLE: Final = "55P03"


@dataclass(frozen=True)
class ServicePolicy:
    """The service reconciler's knobs (workers/settings.py: service_policy)."""

    # A replica unavailable this long no longer counts: a replacement is placed.
    heal_grace_s: float = 30.0
    # Placements (decisions) per service and step: a sweep every few seconds still
    # places a large service quickly, and one step's transaction stays short.
    max_placements_per_step: int = 16
    # A failed acquisition or load on a node keeps the service off it for
    # backoff_base_s * 2**(failures - 1), at most backoff_max_s.
    backoff_base_s: float = 10.0
    backoff_max_s: float = 600.0
    # A replica's artifact job or load queued this long and never claimed (its node
    # online, nothing there taking jobs of that kind) fails, and goes elsewhere.
    claim_timeout_s: float = 300.0

    def backoff(self, failures: int) -> timedelta:
        return timedelta(seconds=min(self.backoff_max_s, self.backoff_base_s * 2 ** (failures - 1)))


# ------------------------------------------------------------------ events and transitions


def record(
    session: AsyncSession,
    service: Service,
    action: str,
    *,
    actor: str,
    event_type: EventType = EventType.SERVICE_CHANGED,
    replica: ServiceReplica | None = None,
    reason: str | None = None,
    receipt: PlacementReceipt | None = None,
) -> None:
    """One event about the service (or one of its replicas), in the caller's transaction."""
    changes.record(
        session,
        event_type,
        ServiceEvent(
            service_id=service.id,
            name=service.name,
            action=action,
            replicas=service.replicas,
            generation=replica.generation if replica is not None else service.generation,
            replica_id=replica.id if replica is not None else None,
            node_id=replica.node_id if replica is not None else None,
            phase=replica.phase if replica is not None else None,
            reason=reason[:300] if reason else None,
            receipt=receipt,
        ),
        actor=actor,
    )


def move(
    session: AsyncSession,
    service: Service,
    replica: ServiceReplica,
    phase: ReplicaPhase,
    now: datetime,
    *,
    reason: str,
    actor: str,
) -> None:
    """One phase change: the row and its event (none when the phase is the same)."""
    if replica.phase == phase.value:
        return
    replica.phase = phase.value
    replica.phase_changed_at = replica.updated_at = now
    record(
        session,
        service,
        phase.value,
        actor=actor,
        event_type=EventType.SERVICE_REPLICA_CHANGED,
        replica=replica,
        reason=reason,
    )


def end(
    session: AsyncSession,
    service: Service,
    replica: ServiceReplica,
    now: datetime,
    *,
    reason: str,
    actor: str,
    failure: ReplicaFailure | None = None,
) -> None:
    """The replica ended: drained, replaced, or failed (with why)."""
    if failure is not None:
        replica.failure_code = failure.code[:64]
        replica.failure_detail = failure.detail[:500] or None
    replica.ended_reason = (replica.ended_reason or reason)[:64]
    move(session, service, replica, ReplicaPhase.ENDED, now, reason=reason, actor=actor)


def back_off(service: Service, node_id: uuid.UUID, now: datetime, policy: ServicePolicy) -> None:
    """Keep the service's next placements off this node for a while, longer each time
    it failed there (schemas: Service.backoff, read by store/services/placement.py)."""
    key = str(node_id)
    failures = int((service.backoff or {}).get(key, {}).get("failures", 0)) + 1
    until = now + policy.backoff(failures)
    # Entries past their time by more than the cap are forgotten (the map stays small);
    # a new dict: JSONB columns are not tracked for changes in place.
    forget = now - timedelta(seconds=policy.backoff_max_s)
    kept = {}
    for node, entry in (service.backoff or {}).items():
        until_then = _until(entry)
        if until_then is None or until_then > forget:
            kept[node] = entry
    service.backoff = {**kept, key: {"until": until.isoformat(), "failures": failures}}


def _until(entry: Any) -> datetime | None:
    """An entry's time, None when it cannot be read (kept as it is)."""
    if not isinstance(entry, dict):
        return None
    try:
        until = datetime.fromisoformat(str(entry.get("until")))
    except ValueError:
        return None
    return until if until.tzinfo is not None else None


def forgive(service: Service, node_id: uuid.UUID) -> None:
    """A replica became ready on the node: its failures there are forgotten."""
    if str(node_id) in (service.backoff or {}):
        service.backoff = {k: v for k, v in service.backoff.items() if k != str(node_id)}


def fail(
    session: AsyncSession,
    service: Service,
    replica: ServiceReplica,
    now: datetime,
    policy: ServicePolicy,
    failure: ReplicaFailure,
    *,
    actor: str,
) -> None:
    """A failed acquisition or load: the replica ends and its node is backed off."""
    back_off(service, replica.node_id, now, policy)
    end(session, service, replica, now, reason="failed", actor=actor, failure=failure)


# ------------------------------------------------------------------ starting one


def template_of(service: Service, generation: int) -> ServiceTemplate | None:
    """What replicas of this generation run: the current template, or the previous one
    for the previous generation (kept serving while a rollout is stopped); None for an
    older one."""
    if generation == service.generation:
        return ServiceTemplate.model_validate(service.template)
    if generation == service.previous_generation and service.previous_template is not None:
        return ServiceTemplate.model_validate(service.previous_template)
    return None


async def start(
    session: AsyncSession,
    service: Service,
    receipt: PlacementReceipt,
    now: datetime,
    policy: ServicePolicy,
    *,
    actor: str,
    generation: int | None = None,
) -> ServiceReplica | None:
    """A replica of the service's current generation where `receipt` placed it: acquiring
    (an artifact job) when the node lacks the file, else loading (a deployment). None when
    another service's replica took the device first (the unique index on a live device
    refuses the second; nothing of this one is kept). A creation the rules refuse ends
    the replica failed and backs the node off."""
    assert receipt.node_id is not None and receipt.device_id is not None
    # The node's lock before the replica's row: two services placing on one device meet
    # here instead of on the unique index. Only tried (store/locks.py): the step may hold
    # other nodes' locks already, and waiting here could close a cycle with another step
    # placing the other way; held elsewhere, the placement waits for the next sweep.
    if not await try_lock_node(session, receipt.node_id):
        return None
    replica = ServiceReplica(
        id=uuid.uuid4(),
        service_id=service.id,
        generation=service.generation if generation is None else generation,
        node_id=receipt.node_id,
        device_id=receipt.device_id,
        phase=ReplicaPhase.LOADING.value,
        receipt=receipt.model_dump(mode="json"),
        created_at=now,
        updated_at=now,
        phase_changed_at=now,
    )
    try:
        async with session.begin_nested():
            session.add(replica)
            await session.flush()
    except IntegrityError:
        return None
    template = template_of(service, replica.generation)
    assert template is not None, "a replica is started for the current or previous generation"
    if receipt.holds_artifact:
        failure = await load(session, service, replica, template, actor=actor)
        if failure is not None and failure.code == ErrorCode.ARTIFACT_NOT_ON_NODE.value:
            failure = await acquire(session, replica, template, actor=actor)
    else:
        failure = await acquire(session, replica, template, actor=actor)
    phase = ReplicaPhase.ACQUIRING if replica.artifact_job_id else ReplicaPhase.LOADING
    replica.phase = phase.value
    record(
        session,
        service,
        phase.value,
        actor=actor,
        event_type=EventType.SERVICE_REPLICA_CHANGED,
        replica=replica,
        reason="placed",
        receipt=receipt,
    )
    if failure is not None:
        fail(session, service, replica, now, policy, failure, actor=actor)
    return replica


async def try_lock_node(session: AsyncSession, node_id: uuid.UUID) -> bool:
    """The node's event lock and row lock (nodes.lock's, in its order) if nobody holds
    either now, without waiting; whether this transaction holds them. The row lock is
    taken NOWAIT inside a savepoint, so a refusal leaves the transaction usable."""
    try:
        async with session.begin_nested():
            if not (await session.execute(select(node_try_xact_lock(node_id)))).scalar_one():
                return False
            await session.execute(
                select(Node.id).where(Node.id == node_id).with_for_update(nowait=True)
            )
    except DBAPIError as error:
        if getattr(error.orig, "sqlstate", None) == LOCK_NOT_AVAILABLE:
            return False
        raise
    return True


def _refused(error: StoreError) -> ReplicaFailure:
    return ReplicaFailure(code=error.code.value, detail=error.message[:500])


async def acquire(
    session: AsyncSession, replica: ServiceReplica, template: ServiceTemplate, *, actor: str
) -> ReplicaFailure | None:
    """The artifact job that brings the file to the replica's node, as an operator's
    would be (the manifest: the resolved commit, the file's size and sha256); None when
    it was queued, else why not."""
    artifact = template.artifact
    if artifact.sha256 is None:
        # The node verifies every file against a digest the job carries; without the
        # file's sha256 the control plane has nothing to give it.
        return ReplicaFailure(
            code="artifact_unverifiable",
            detail="the source gave no sha256 for the file: only a node that holds it can serve",
        )
    roots = await artifacts.allowed_roots(session, replica.node_id)
    if not roots:
        return ReplicaFailure(code="no_root", detail="the node offers no artifact root")
    manifest = ArtifactManifest(
        repository=artifact.repository,
        commit=artifact.commit,
        files=[
            ArtifactFile(
                path=artifact.path,
                size=artifact.size_bytes,
                digest=Sha256Digest(algorithm="sha256", value=artifact.sha256),
            )
        ],
    )
    target = JobTarget(node_id=replica.node_id, target_root=roots[0], max_attempts=ACQUIRE_ATTEMPTS)
    try:
        async with session.begin_nested():
            job = await artifacts.create(session, target, manifest, actor=actor)
            await session.flush()
    except StoreError as error:
        return _refused(error)
    replica.artifact_job_id = job.id
    return None


async def environment_on(
    session: AsyncSession, node_id: uuid.UUID, device_id: str
) -> uuid.UUID | None:
    """The environment a node's runtime worker reports for the device's backend, the
    newest first reported (a template's environment None: "the one each node reports")."""
    reported = await runtime.node_runtime(session, node_id) or {}
    backend = next(
        (d.get("backend") for d in reported.get("devices", []) if d.get("device_id") == device_id),
        None,
    )
    listed = reported.get("environments", [])
    binaries = [
        e["binary_sha256"] for e in listed if backend is None or e.get("backend") == backend
    ]
    if not binaries:
        binaries = [e["binary_sha256"] for e in listed]
    if not binaries:
        return None
    found = await session.execute(
        select(RuntimeEnvironment.id)
        .where(RuntimeEnvironment.binary_sha256.in_(binaries))
        .order_by(RuntimeEnvironment.first_reported_at.desc())
        .limit(1)
    )
    return found.scalar_one_or_none()


async def load(
    session: AsyncSession,
    service: Service,
    replica: ServiceReplica,
    template: ServiceTemplate,
    *,
    actor: str,
) -> ReplicaFailure | None:
    """The replica's deployment, created as an operator's would be (the node's verified
    copy, the admitted profile, a device its runtime worker reports); None when it was
    created, else why not."""
    environment_id = template.environment_id or await environment_on(
        session, replica.node_id, replica.device_id
    )
    if environment_id is None:
        return ReplicaFailure(
            code=ErrorCode.ENVIRONMENT_NOT_ON_NODE.value,
            detail="the node's runtime worker reports no environment",
        )
    artifact = template.artifact
    try:
        request = DeploymentCreate(
            node_id=replica.node_id,
            device_id=replica.device_id,
            artifact=ArtifactRef(
                repository=artifact.repository, commit=artifact.commit, path=artifact.path
            ),
            profile_id=template.profile_id,
            environment_id=environment_id,
            model=service.name,
            roles=list(service.roles),
            max_concurrent=template.max_concurrent,
            endpoints=list(template.endpoints),
            max_attempts=LOAD_ATTEMPTS,
        )
        async with session.begin_nested():
            deployment = await deployments.create(session, request, actor=actor)
            await session.flush()
    except StoreError as error:
        return _refused(error)
    except ValueError as error:  # a template the deployment's own model refuses
        return ReplicaFailure(code=ErrorCode.VALIDATION_FAILED.value, detail=str(error)[:500])
    replica.deployment_id = deployment.id
    return None


# ------------------------------------------------------------------ draining


async def drain(
    session: AsyncSession,
    service: Service,
    replica: ServiceReplica,
    now: datetime,
    deadline_s: float,
    *,
    reason: str,
    actor: str,
) -> None:
    """Take the replica out of service without cutting a stream: its deployment drains
    (in-flight invokes get `deadline_s`), then unloads; the replica ends once it has. One
    still acquiring has nothing to drain: its job is cancelled and it ends now."""
    replica.ended_reason = reason[:64]
    if replica.deployment_id is None:
        await cancel_acquisition(session, replica, now, actor=actor)
        end(session, service, replica, now, reason=reason, actor=actor)
        return
    try:
        async with session.begin_nested():
            await deployments.drain(session, replica.deployment_id, deadline_s, actor=actor)
    except StoreError:
        # It already ended (failed, unloaded): nothing left to drain.
        end(session, service, replica, now, reason=reason, actor=actor)
        return
    move(session, service, replica, ReplicaPhase.DRAINING, now, reason=reason, actor=actor)


async def cancel_acquisition(
    session: AsyncSession, replica: ServiceReplica, now: datetime, *, actor: str
) -> None:
    if replica.artifact_job_id is None:
        return
    # The lock order: the node, then its job.
    await nodes.lock(session, replica.node_id)
    job = await session.get(
        Job, replica.artifact_job_id, with_for_update=True, populate_existing=True
    )
    if job is not None and job.state not in leases.FINISHED:
        leases.request_cancel(session, job, now, actor=actor)


# ------------------------------------------------------------------ following one

# The ended_reason of a replica whose node is gone (decommissioned, disabled, or
# offline past the drain deadline and the heal grace while it drained): not a failure.
NODE_LOST: Final = "node_lost"
