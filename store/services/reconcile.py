"""The service reconciler's decisions (workers/service_reconcile.py runs them): for each
service not deleted, one step towards what its rules declare (store/services/rules.py).

A step holds the service's row (FOR UPDATE SKIP LOCKED: any number of workers sweep at
once, one of them moves a given service, the others pass it by), and then:
* follows each live replica after its artifact job and deployment (store/services/
  replicas.py: follow);
* deleting: drains every replica, and marks the service deleted when none is live;
* autoscale: moves the desired count on the gateway's measurements (in flight and time
  to first token, store/services/measurements.py) and the nodes' queue depth;
* heals and scales: a replica unavailable past the heal grace no longer counts, so a
  replacement is placed; fewer counted than desired places more (store/services/
  placement.py: decide, a receipt each), more drains the surplus, never cut;
* rolls out: replicas of an older generation are replaced with Kubernetes's rolling
  update rules (at most max_surge above the desired count, at most max_unavailable
  ready ones short of it); a new replica that fails stops the rollout, the old ones keep
  serving (one lost meanwhile is replaced by one of the previous template); complete
  once every counted replica is current and ready.

While the partition breaker holds (`hold`), nothing is healed: replicas that look lost
are more likely cut off than gone.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from schemas.events import EventType
from schemas.services import (
    Autoscale,
    PlacementReceipt,
    ReplicaPhase,
    RolloutState,
    ServiceState,
    UpdateStrategy,
)
from store import nodes
from store.deployments.tables import Deployment
from store.models import Job, Node
from store.services import following, measurements, placement
from store.services import replicas as steps
from store.services.replicas import ServicePolicy
from store.services.snapshot import FleetCache
from store.services.tables import Service, ServiceReplica

__all__ = ["ServicePolicy", "due", "placements", "reconcile_one"]

PLACED = "placed on"

NOT_READY = (
    ReplicaPhase.ACQUIRING.value,
    ReplicaPhase.LOADING.value,
    ReplicaPhase.UNAVAILABLE.value,
)


async def due(session: AsyncSession, *, limit: int, after: uuid.UUID | None) -> list[uuid.UUID]:
    """Ids of services not deleted, in id order from `after` (a sweep pages)."""
    query = select(Service.id).where(Service.state != ServiceState.DELETED.value)
    if after is not None:
        query = query.where(Service.id > after)
    rows = await session.execute(query.order_by(Service.id).limit(limit))
    return list(rows.scalars().all())


def placements(actions: list[str]) -> int:
    """How many replicas a step's actions placed."""
    return sum(1 for action in actions if PLACED in action)


@dataclass
class Step:
    """One step's context: the locked service, its live replicas, what was done."""

    session: AsyncSession
    service: Service
    live: list[ServiceReplica]
    now: datetime
    policy: ServicePolicy
    hold: bool
    actor: str
    cache: FleetCache
    done: list[str]

    def counts(self, replica: ServiceReplica) -> bool:
        """Whether it counts towards the desired replicas: not draining, and not
        unavailable past the heal grace (unless healing is held)."""
        if replica.phase == ReplicaPhase.DRAINING.value:
            return False
        if replica.phase == ReplicaPhase.UNAVAILABLE.value and not self.hold:
            grace = timedelta(seconds=self.policy.heal_grace_s)
            return self.now - replica.phase_changed_at < grace
        return True

    def counted(self) -> list[ServiceReplica]:
        return [r for r in self.live if r.phase in steps.LIVE and self.counts(r)]


async def _locked(session: AsyncSession, service_id: uuid.UUID) -> Service | None:
    found = await session.execute(
        select(Service)
        .where(Service.id == service_id)
        .with_for_update(skip_locked=True)
        .execution_options(populate_existing=True)
    )
    return found.scalar_one_or_none()


async def _live(session: AsyncSession, service_id: uuid.UUID) -> list[ServiceReplica]:
    """The live replicas, with their deployments and jobs read in two queries (the
    session's identity map then answers each replica's follow)."""
    rows = await session.execute(
        select(ServiceReplica)
        .where(ServiceReplica.service_id == service_id, ServiceReplica.phase.in_(steps.LIVE))
        .order_by(ServiceReplica.created_at, ServiceReplica.id)
        .execution_options(populate_existing=True)
    )
    live = list(rows.scalars().all())
    deployment_ids = [r.deployment_id for r in live if r.deployment_id is not None]
    job_ids = [r.artifact_job_id for r in live if r.artifact_job_id is not None]
    if deployment_ids:
        await session.execute(select(Deployment).where(Deployment.id.in_(deployment_ids)))
    if job_ids:
        await session.execute(select(Job).where(Job.id.in_(job_ids)))
    return live


async def reconcile_one(
    session: AsyncSession,
    service_id: uuid.UUID,
    policy: ServicePolicy,
    *,
    hold: bool,
    actor: str,
    cache: FleetCache,
) -> list[str] | None:
    """Move the service one step; what it did (empty: nothing to do), or None when it
    is gone, deleted, or another worker holds it now. `cache`: the process's fleet
    snapshot, which placement decides from (store/services/snapshot.py)."""
    service = await _locked(session, service_id)
    if service is None or service.state == ServiceState.DELETED.value:
        return None
    now = await nodes.now(session)
    live = await _live(session, service_id)
    step = Step(session, service, live, now, policy, hold, actor, cache, [])
    await _follow(step)
    if service.state == ServiceState.DELETING.value:
        await _delete(step)
        return step.done
    await _autoscale(step)
    await _place(step)
    await _drain_surplus(step)
    _complete_rollout(step)
    return step.done


# ------------------------------------------------------------------ following


async def _follow(step: Step) -> None:
    service = step.service
    rolling = service.rollout_state == RolloutState.PROGRESSING.value
    # In node-id order: a follow may lock its replica's node (store/locks.py), and two
    # steps locking nodes in one order cannot wait on each other in a cycle.
    for replica in sorted(step.live, key=lambda r: (r.node_id, r.created_at, r.id)):
        action = await following.follow(
            step.session, service, replica, step.now, step.policy, actor=step.actor
        )
        if action is None and replica.phase == ReplicaPhase.ACQUIRING.value:
            action = await _acquiring_offline(step, replica)
        if action is None and replica.phase == ReplicaPhase.DRAINING.value:
            action = await _draining_offline(step, replica)
        if action is None:
            continue
        step.done.append(f"replica {replica.id}: {action}")
        if rolling and _failed_new(step, replica):
            _stop_rollout(step, replica)
            rolling = False


async def _acquiring_offline(step: Step, replica: ServiceReplica) -> str | None:
    """An acquisition whose node went offline waits for it (its job's lease does): past
    the heal grace, and unless healing is held, it is given up and placed elsewhere."""
    if step.hold:
        return None
    node = await step.session.get(Node, replica.node_id)
    usable = node is not None and node.enabled and node.decommissioned_at is None
    if usable and node is not None and node.liveness == "online":
        return None
    # The grace counts from when it could no longer acquire: the later of its start and
    # its node's last liveness change.
    since = replica.phase_changed_at
    if node is not None and node.liveness_changed_at is not None:
        since = max(since, node.liveness_changed_at)
    if step.now - since < timedelta(seconds=step.policy.heal_grace_s):
        return None
    await steps.drain(step.session, step.service, replica, step.now, 0.0, reason="node_offline",
                      actor=step.actor)  # fmt: skip
    steps.back_off(step.service, replica.node_id, step.now, step.policy)
    return "given up (node offline)"


async def _draining_offline(step: Step, replica: ServiceReplica) -> str | None:
    """A replica draining on a node offline (still enabled) past its drain deadline and
    the heal grace ends "node_lost", so a delete or a scale-down completes; its
    deployment stays draining, and the deployment reconciler unloads it when the node
    returns (its device stays busy for placements until then). Not while healing is
    held: a partition is more likely than a loss."""
    if step.hold:
        return None
    node = await step.session.get(Node, replica.node_id)
    if node is not None and node.liveness == "online":
        return None
    deployment = (
        await step.session.get(Deployment, replica.deployment_id)
        if replica.deployment_id is not None
        else None
    )
    deadline = timedelta(seconds=(deployment.drain_deadline_s or 0.0) if deployment else 0.0)
    grace = timedelta(seconds=step.policy.heal_grace_s)
    since = replica.phase_changed_at + deadline
    if node is not None and node.liveness_changed_at is not None:
        since = max(since, node.liveness_changed_at)
    if step.now - since < grace:
        return None
    steps.end(step.session, step.service, replica, step.now, reason=steps.NODE_LOST,
              actor=step.actor)  # fmt: skip
    replica.ended_reason = steps.NODE_LOST
    return "ended (node offline past the drain deadline)"


def _failed_new(step: Step, replica: ServiceReplica) -> bool:
    return (
        replica.phase == ReplicaPhase.ENDED.value
        and replica.ended_reason == "failed"
        and replica.generation == step.service.generation
    )


def _stop_rollout(step: Step, replica: ServiceReplica) -> None:
    """A new replica failed: no more are placed, the old ones keep serving, until an
    undo or another rollout (store/services/rules.py)."""
    service = step.service
    reason = f"replica {replica.id} failed on node {replica.node_id}: {replica.failure_code}"
    service.rollout_state = RolloutState.STOPPED.value
    service.rollout_reason = reason[:300]
    service.updated_at = step.now
    steps.record(step.session, service, "rollout_stopped", actor=step.actor, reason=reason)
    step.done.append("rollout stopped")


# ------------------------------------------------------------------ delete


async def _delete(step: Step) -> None:
    service = step.service
    deadline = UpdateStrategy.model_validate(service.strategy).drain_deadline_s
    for replica in step.live:
        if replica.phase in (ReplicaPhase.DRAINING.value, ReplicaPhase.ENDED.value):
            continue
        await steps.drain(step.session, service, replica, step.now, deadline, reason="deleted",
                          actor=step.actor)  # fmt: skip
        step.done.append(f"replica {replica.id}: draining (deleted)")
    if any(replica.phase != ReplicaPhase.ENDED.value for replica in step.live):
        return
    service.state = ServiceState.DELETED.value
    service.updated_at = step.now
    steps.record(step.session, service, "deleted", actor=step.actor)
    step.done.append("deleted")


# ------------------------------------------------------------------ autoscale


async def _autoscale(step: Step) -> None:
    """On the gateway's own measurements (store/services/measurements.py) and the
    runtime workers' reports, per ready replica:

    * the queue: the invokes the API processes have in flight for the service's name
      (summed over their fresh rows), or the invokes in flight or queued that the
      runtime workers report for the ready deployments if that is more. Both count the
      same invokes from either end, so they are not added: the gateway's is fresher
      (written every few seconds, waiting for a first token included), the nodes' holds
      invokes of gateways whose rows are stale;
    * the time to first token: the p90 of the API processes' recent streams (their p90s
      weighted by their samples), when `target_ttft_s` is set.

    Up when either is above its target, down only when both are below half of it
    (hysteresis; no time known counts as below), never within the cooldown of the last
    change (an operator's scale included), between min and max."""
    service = step.service
    if service.autoscale is None:
        return
    bounds = Autoscale.model_validate(service.autoscale)
    cooldown = timedelta(seconds=bounds.cooldown_s)
    if service.scaled_at is not None and step.now - service.scaled_at < cooldown:
        return
    ready = [
        r.deployment_id
        for r in step.live
        if r.phase == ReplicaPhase.READY.value and r.deployment_id is not None
    ]
    if not ready:
        return
    depths = await step.session.execute(
        select(Deployment.queue_depth).where(Deployment.id.in_(ready))
    )
    reported = sum(depth or 0 for depth in depths.scalars())
    gateway = await measurements.read(step.session, service.name)
    queued = max(reported, gateway.in_flight)
    per = queued / len(ready)
    target = bounds.target_queue_per_replica
    ttft, ttft_target = gateway.ttft_p90_s, bounds.target_ttft_s
    slow = ttft_target is not None and ttft is not None and ttft > ttft_target
    quick = ttft_target is None or ttft is None or ttft < ttft_target / 2
    current = service.replicas
    wanted = current
    if per > target or slow:
        wanted = max(current + 1, math.ceil(queued / target))
    elif per < target / 2 and quick:
        wanted = min(current - 1, math.ceil(queued / target))
    wanted = max(bounds.min_replicas, min(bounds.max_replicas, wanted))
    if wanted == current:
        return
    service.replicas = wanted
    service.scaled_at = service.updated_at = step.now
    reason = (
        f"queue {queued} over {len(ready)} ready (gateway {gateway.in_flight} in flight"
        f" from {gateway.rows} API processes, nodes {reported}; per replica {per:.2f},"
        f" target {target:g}, down below {target / 2:g})"
    )
    if ttft_target is not None:
        known = f"{ttft:.3f} s of {gateway.ttft_count} streams" if ttft is not None else "unknown"
        reason += f"; ttft p90 {known} (target {ttft_target:g} s, down below {ttft_target / 2:g} s)"
    reason += f": {current} -> {wanted}"
    steps.record(step.session, service, "autoscaled", actor=step.actor, reason=reason)
    step.done.append(f"autoscaled {current} -> {wanted}")


# ------------------------------------------------------------------ placing


def _receipt(step: Step, receipt: PlacementReceipt) -> None:
    """The decision on the service; an unplaceable one is an event only when its
    message changed (a sweep every few seconds must not flood the stream)."""
    service = step.service
    last = service.last_receipt or {}
    changed = last.get("message") != receipt.message or last.get("outcome") != receipt.outcome
    if receipt.outcome == "placed" or changed:
        service.last_receipt = receipt.model_dump(mode="json")
    if receipt.outcome == "unplaceable" and changed:
        steps.record(step.session, service, "unplaceable", actor=step.actor,
                     event_type=EventType.SERVICE_UNPLACEABLE, reason=receipt.message,
                     receipt=receipt)  # fmt: skip
        step.done.append("unplaceable")


async def _place(step: Step) -> None:
    """New replicas of the current generation while fewer are counted than desired, at
    most max_surge above it while outdated ones remain (a rollout), none while a
    rollout is stopped; a bounded number of decisions per step."""
    service = step.service
    strategy = UpdateStrategy.model_validate(service.strategy)
    desired = service.replicas
    for _ in range(step.policy.max_placements_per_step):
        if service.rollout_state == RolloutState.STOPPED.value:
            if not await _heal_stopped(step):
                return
            continue
        counted = step.counted()
        new = [r for r in counted if r.generation == service.generation]
        old = [r for r in counted if r.generation != service.generation]
        room = desired + (strategy.max_surge if old else 0)
        if len(new) >= desired or len(new) + len(old) >= room:
            return
        receipt = await placement.decide(step.session, service, step.now, step.cache)
        _receipt(step, receipt)
        if receipt.outcome != "placed":
            return
        replica = await steps.start(
            step.session, service, receipt, step.now, step.policy, actor=step.actor
        )
        if replica is None:
            return  # the device went to another service's replica just now
        step.live.append(replica)
        step.done.append(f"replica {replica.id}: {PLACED} {replica.node_id} ({replica.phase})")
        if replica.phase == ReplicaPhase.ENDED.value:
            step.done.append(f"replica {replica.id}: {replica.failure_code}")
            if old and service.rollout_state == RolloutState.PROGRESSING.value:
                _stop_rollout(step, replica)


async def _heal_stopped(step: Step) -> bool:
    """While a rollout is stopped no replica of the new template is placed; one lost
    meanwhile is replaced by one of the previous template (the generation still
    serving), so the service keeps its count until an undo or another rollout. Whether
    one was placed."""
    service = step.service
    generation = service.previous_generation
    if generation is None or service.previous_template is None:
        return False
    if len(step.counted()) >= service.replicas:
        return False
    # The decision for the previous template: a copy of the row that is never added to
    # the session (decide only reads it).
    previous = Service(
        id=service.id,
        name=service.name,
        template=service.previous_template,
        placement=service.placement,
        backoff=service.backoff,
        generation=generation,
    )
    receipt = await placement.decide(step.session, previous, step.now, step.cache)
    _receipt(step, receipt)
    if receipt.outcome != "placed":
        return False
    replica = await steps.start(step.session, service, receipt, step.now, step.policy,
                                actor=step.actor, generation=generation)  # fmt: skip
    if replica is None:
        return False
    step.live.append(replica)
    step.done.append(f"replica {replica.id}: {PLACED} {replica.node_id} ({replica.phase})")
    return True


# ------------------------------------------------------------------ draining the surplus


def _drain_order(replicas: list[ServiceReplica]) -> list[ServiceReplica]:
    """Not ready ones first (nothing served is lost), then the ready ones that became
    ready last (one that came back after it was replaced), then the newest."""
    return sorted(
        replicas,
        key=lambda r: (
            r.phase == ReplicaPhase.READY.value,
            -r.phase_changed_at.timestamp(),
            -r.created_at.timestamp(),
        ),
    )


async def _drain_surplus(step: Step) -> None:
    """Counted replicas above the desired count drain: the current generation's surplus
    (a scale-down, a lost one back), then the outdated ones (a rollout). A ready one
    drains only while at least desired - max_unavailable stay ready, so a rollout's old
    replica waits for a new one to be ready. Outdated replicas that no longer count
    (unavailable past the grace) drain as well: nothing will bring them back into use."""
    service = step.service
    strategy = UpdateStrategy.model_validate(service.strategy)
    desired = service.replicas
    counted = step.counted()
    new = [r for r in counted if r.generation == service.generation]
    old = [r for r in counted if r.generation != service.generation]
    ready = sum(1 for r in counted if r.phase == ReplicaPhase.READY.value)
    floor = desired - strategy.max_unavailable
    total = len(new) + len(old)

    async def drain(replica: ServiceReplica, reason: str) -> None:
        await steps.drain(step.session, service, replica, step.now, strategy.drain_deadline_s,
                          reason=reason, actor=step.actor)  # fmt: skip
        step.done.append(f"replica {replica.id}: draining ({reason})")

    surplus_new = len(new) - desired
    for replica in _drain_order(new):
        if surplus_new <= 0:
            break
        if replica.phase == ReplicaPhase.READY.value:
            if ready - 1 < floor:
                continue
            ready -= 1
        await drain(replica, "surplus")
        surplus_new -= 1
        total -= 1
    # Oldest generation first, down to desired - max_unavailable: with max_unavailable
    # above 0 an old replica may make room for a new one on a full fleet (the ready
    # floor still holds).
    for replica in sorted(_drain_order(old), key=lambda r: r.generation):
        if total <= max(desired - strategy.max_unavailable, 0) or (
            total <= desired and service.rollout_state != RolloutState.PROGRESSING.value
        ):
            break
        if replica.phase == ReplicaPhase.READY.value:
            if ready - 1 < floor:
                continue
            ready -= 1
        await drain(replica, "replaced")
        total -= 1
    for replica in step.live:
        if (
            replica.generation != service.generation
            and replica.phase == ReplicaPhase.UNAVAILABLE.value
            and not step.counts(replica)
        ):
            await drain(replica, "replaced")


def _complete_rollout(step: Step) -> None:
    service = step.service
    if service.rollout_state != RolloutState.PROGRESSING.value:
        return
    serving = [r for r in step.live if r.phase not in (ReplicaPhase.DRAINING.value,
                                                       ReplicaPhase.ENDED.value)]  # fmt: skip
    if any(r.generation != service.generation for r in serving):
        return
    ready = [r for r in serving if r.phase == ReplicaPhase.READY.value]
    if len(ready) < service.replicas:
        return
    service.rollout_state = RolloutState.COMPLETE.value
    service.rollout_reason = None
    service.updated_at = step.now
    steps.record(step.session, service, "rollout_complete", actor=step.actor)
    step.done.append("rollout complete")
