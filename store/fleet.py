"""Fleet-level safety, shared by the API (presence, the hold's view, acknowledgement) and
the sweepers (the partition breaker).

**Restart grace.** Every API process refreshes one presence row each second. A refresh
that finds the row older than the presence gap means no API ran in between: that span
is recorded as the last outage, and store/liveness.py shifts every heartbeat that
predates it. While the row is older than the gap right now, no API is there to hear
heartbeats, so the sweeper records nothing at all (`api_present`).

**Partition breaker.** A share of the fleet going silent together is more likely a
network partition between the nodes and the control plane than that many hosts dying.
Each sweep counts the *watched* nodes (recorded online or stale) and the *silent* ones
among them (their heartbeat is past the stale threshold). The window is the stale band:
a node counts as silent from the stale threshold until it is recorded offline. Above
`share`, an incident opens and offline transitions are held; stale ones are still
recorded, so the picture stays true. The hold ends when the silent share falls to half
the threshold (the incident resolves), or when an operator acknowledges the incident:
then the silent nodes go offline, leave the watched set, and the incident resolves by
itself. Lease expiry and rescheduling honour the same `partition_hold_active`.

Both are safe with any number of sweepers: one open incident per kind is a unique
index, and every state change is a conditional UPDATE whose RETURNING decides who emits
the event.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Final

from sqlalchemy import and_, case, func, not_, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from schemas.errors import ErrorCode
from schemas.events import (
    OPERATOR_ACTOR,
    EventType,
    PartitionAcknowledged,
    PartitionResolved,
    PartitionSuspected,
    worker_actor,
)
from store import changes, nodes
from store.errors import Conflict, Missing
from store.liveness import API, LivenessThresholds, liveness_expression, seconds
from store.models import ControlPlanePresence, FleetIncident, Node

PARTITION: Final = "partition_suspected"
WATCHED: Final = ("online", "stale")
SILENT: Final = ("stale", "offline")
SWEEPER: Final = worker_actor("liveness")


@dataclass(frozen=True)
class PartitionBreaker:
    # Trip when more than this share of the watched nodes is silent.
    share: float = 0.3
    # Below this many watched nodes the breaker stays open: in a small fleet a few
    # failures are a large share, and holding them would hide real outages.
    min_nodes: int = 10


# ---------------------------------------------------------------------- presence


async def beat(
    session: AsyncSession,
    *,
    gap_s: float,
    merge_within_s: float = 0.0,
    component: str = API,
    shed: bool = False,
) -> bool:
    """Refresh the presence row; True when this refresh ended an outage.

    Only the last outage is kept, and it shifts every heartbeat older than its end. So an
    outage that begins within `merge_within_s` of the last one's end (a second gap while
    the fleet is still coming back, say an event loop stalled by the return storm) is
    recorded as one with it, from the first one's start: recorded alone, it would have
    replaced the first one's shift with its own short one, and the nodes not heard again
    yet would have gone stale at once. The span between counts as silent too, which
    only delays an offline (the safe way). The API passes stale_after + restart_grace:
    past that, every returning node has been heard or is rightly silent.

    shed: this process refused node requests since its last beat (api/shedding.py);
    recorded as `shed_at`, which holds the sweepers (`shedding_recently`)."""
    now = func.statement_timestamp()
    table = ControlPlanePresence
    absent = table.last_seen_at < now - seconds(gap_s)
    # The last outage (a real one: the first row has down_since = resumed_at) ended
    # shortly before this one began.
    follows = and_(
        table.resumed_at > table.down_since,
        table.resumed_at >= table.last_seen_at - seconds(merge_within_s),
    )
    statement = (
        insert(table)
        .values(
            component=component,
            last_seen_at=now,
            down_since=now,
            resumed_at=now,
            shed_at=now if shed else None,
        )
        .on_conflict_do_update(
            index_elements=[table.component],
            # The right-hand sides read the row as it was before this update.
            set_={
                "down_since": case(
                    (and_(absent, not_(follows)), table.last_seen_at), else_=table.down_since
                ),
                "resumed_at": case((absent, now), else_=table.resumed_at),
                "last_seen_at": now,
                **({"shed_at": now} if shed else {}),
            },
        )
        .returning(and_(table.resumed_at == now, table.resumed_at > table.down_since))
    )
    return bool((await session.execute(statement)).scalar_one())


async def api_present(session: AsyncSession, *, gap_s: float) -> bool:
    """False while no API process has refreshed its presence within the gap.

    No row at all means no API of this version ever ran: nothing to protect.
    """
    fresh = ControlPlanePresence.last_seen_at >= func.statement_timestamp() - seconds(gap_s)
    row = (
        await session.execute(select(fresh).where(ControlPlanePresence.component == API))
    ).scalar_one_or_none()
    return row is None or bool(row)


async def shedding_recently(session: AsyncSession, *, within_s: float) -> bool:
    """True while an API process reported shedding load within the last `within_s`.

    A shed heartbeat is one the control plane refused to hear, so the silence it leaves
    is not the node's: the sweepers record nothing meanwhile. Held for a whole stale
    threshold after the last refusal (the hysteresis), so every node refused during the
    overload is heard again (Retry-After is at most a heartbeat interval) before its
    silence counts again.
    """
    p = ControlPlanePresence
    recent = p.shed_at >= func.statement_timestamp() - seconds(within_s)
    row = (await session.execute(select(recent).where(p.component == API))).scalar_one_or_none()
    return bool(row)


async def presence(session: AsyncSession) -> ControlPlanePresence | None:
    return await session.get(ControlPlanePresence, API)


# ---------------------------------------------------------------------- breaker


@dataclass(frozen=True)
class FleetCount:
    watched: int
    silent: int


async def count_silent(session: AsyncSession, thresholds: LivenessThresholds) -> FleetCount:
    computed = liveness_expression(thresholds)
    watched = Node.liveness.in_(WATCHED)
    row = (
        await session.execute(
            select(
                func.count().filter(watched),
                func.count().filter(and_(watched, computed.in_(SILENT))),
            ).where(Node.enabled.is_(True), Node.decommissioned_at.is_(None))
        )
    ).one()
    return FleetCount(watched=int(row[0]), silent=int(row[1]))


async def open_incident(session: AsyncSession) -> FleetIncident | None:
    return (
        await session.execute(
            select(FleetIncident).where(
                FleetIncident.kind == PARTITION, FleetIncident.resolved_at.is_(None)
            )
        )
    ).scalar_one_or_none()


async def partition_hold_active(session: AsyncSession) -> bool:
    """True while a suspected partition holds offline transitions (and lease expiry)."""
    incident = await open_incident(session)
    return incident is not None and incident.acknowledged_at is None


async def evaluate_partition(
    session: AsyncSession, thresholds: LivenessThresholds, breaker: PartitionBreaker
) -> bool:
    """Open or resolve the partition incident from the fleet as it is now; the hold."""
    count = await count_silent(session, thresholds)
    tripped = count.watched >= breaker.min_nodes and count.silent > breaker.share * count.watched
    recovered = count.watched < breaker.min_nodes or count.silent <= (
        breaker.share / 2 * count.watched
    )
    incident = await open_incident(session)
    if incident is None and tripped:
        await _open(session, count, breaker)
    elif incident is not None and recovered:
        await _resolve(session, incident, count)
    return await partition_hold_active(session)


async def _open(session: AsyncSession, count: FleetCount, breaker: PartitionBreaker) -> None:
    incident_id = uuid.uuid4()
    opened = (
        await session.execute(
            insert(FleetIncident)
            .values(
                id=incident_id,
                kind=PARTITION,
                opened_at=func.statement_timestamp(),
                silent_nodes=count.silent,
                watched_nodes=count.watched,
            )
            .on_conflict_do_nothing(
                index_elements=[FleetIncident.kind],
                index_where=FleetIncident.resolved_at.is_(None),
            )
            .returning(FleetIncident.id)
        )
    ).scalar_one_or_none()
    if opened is None:  # another sweeper opened it first
        return
    event = PartitionSuspected(
        incident_id=incident_id,
        watched_nodes=count.watched,
        silent_nodes=count.silent,
        threshold=breaker.share,
    )
    changes.record(session, EventType.FLEET_PARTITION_SUSPECTED, event, actor=SWEEPER)


async def _resolve(session: AsyncSession, incident: FleetIncident, count: FleetCount) -> None:
    resolved = (
        await session.execute(
            update(FleetIncident)
            .where(FleetIncident.id == incident.id, FleetIncident.resolved_at.is_(None))
            .values(resolved_at=func.statement_timestamp())
            .returning(FleetIncident.acknowledged_at)
        )
    ).one_or_none()
    if resolved is None:
        return
    event = PartitionResolved(
        incident_id=incident.id,
        watched_nodes=count.watched,
        silent_nodes=count.silent,
        acknowledged=resolved.acknowledged_at is not None,
    )
    changes.record(session, EventType.FLEET_PARTITION_RESOLVED, event, actor=SWEEPER)


async def acknowledge(session: AsyncSession, incident_id: uuid.UUID, reason: str) -> FleetIncident:
    """An operator says the silent nodes really are gone: release the hold. Idempotent;
    an unknown incident is Missing, a resolved one a Conflict."""
    incident = await session.get(FleetIncident, incident_id, with_for_update=True)
    if incident is None:
        raise Missing(f"fleet incident {incident_id} does not exist", code=ErrorCode.NOT_FOUND)
    if incident.resolved_at is not None:
        raise Conflict(
            f"fleet incident {incident_id} is already resolved", code=ErrorCode.STATE_CONFLICT
        )
    if incident.acknowledged_at is None:
        incident.acknowledged_at = await nodes.now(session)
        incident.acknowledged_reason = reason
        event = PartitionAcknowledged(incident_id=incident.id, reason=reason)
        changes.record(session, EventType.FLEET_PARTITION_ACKNOWLEDGED, event, actor=OPERATOR_ACTOR)
        await session.flush()
    return incident


async def list_incidents(session: AsyncSession, *, limit: int) -> list[FleetIncident]:
    return list(
        (
            await session.execute(
                select(FleetIncident).order_by(FleetIncident.opened_at.desc()).limit(limit)
            )
        ).scalars()
    )
