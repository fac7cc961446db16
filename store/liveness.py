"""Liveness from server-received heartbeat time (never the agent's clock).

Reads compute it from the timestamp; transitions are recorded on the node (with an
audit row and an event) by the sweep (store/liveness_sweep.py, run by the workers) and
by heartbeats.

Restart grace: silence counts only while the control plane could hear it. When every
API process was down, a node's last heartbeat from before the outage is moved later by
the outage's length plus `restart_grace_s` (the time agents need to find the API again
after their retry backoff). A node that was already silent long before the outage keeps
that silence; one that was healthy gets its thresholds afresh from the moment the API
is back. See store/fleet.py for how outages are recorded.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final, Literal

from sqlalchemy import ColumnElement, case, func, literal, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession

from schemas.events import EventType, LivenessChanged, node_actor, worker_actor
from store import changes
from store.models import ControlPlanePresence, Node

# The presence row every API process refreshes (store/fleet.py).
API: Final = "api"


def presence_gap(configured_s: float | None, stale_after_s: float) -> float:
    """The presence gap: as configured, else 5 s but at most a third of the stale
    threshold, so the sweepers notice that no API is there before a node's silence could
    turn it stale. The API and the workers derive it alike; every API process must use
    the same value (a process with a shorter gap takes the others' beats for outages)."""
    return configured_s if configured_s is not None else min(5.0, stale_after_s / 3)


@dataclass(frozen=True)
class LivenessThresholds:
    stale_after_s: float
    offline_after_s: float
    # Added to the length of an API outage that a node's last heartbeat predates.
    restart_grace_s: float = 30.0
    # No API presence refresh for this long: an outage (store/fleet.py).
    presence_gap_s: float = 5.0


def seconds(value: float) -> ColumnElement[timedelta]:
    return func.make_interval(0, 0, 0, 0, 0, 0, literal(value))


def effective_heartbeat(thresholds: LivenessThresholds) -> ColumnElement[datetime]:
    """last_heartbeat_at, moved later by the last API outage it predates, plus the grace.

    Two one-row subqueries: PostgreSQL evaluates them once per statement.
    """
    p = ControlPlanePresence
    outage = select().where(p.component == API, p.resumed_at > p.down_since)
    resumed = outage.add_columns(p.resumed_at).scalar_subquery()
    shift = outage.add_columns(
        p.resumed_at - p.down_since + seconds(thresholds.restart_grace_s)
    ).scalar_subquery()
    beat = Node.last_heartbeat_at
    return case((beat < resumed, beat + shift), else_=beat)


def liveness_expression(thresholds: LivenessThresholds) -> ColumnElement[str]:
    """SQL for a node's liveness, evaluated against the database clock."""
    now = func.statement_timestamp()
    beat = effective_heartbeat(thresholds)
    return case(
        (Node.decommissioned_at.is_not(None), text("'decommissioned'")),
        (Node.enabled.is_(False), text("'disabled'")),
        (Node.last_heartbeat_at.is_(None), text("'offline'")),
        (beat > now - seconds(thresholds.stale_after_s), text("'online'")),
        (beat > now - seconds(thresholds.offline_after_s), text("'stale'")),
        else_=text("'offline'"),
    )


async def record_transition(
    session: AsyncSession,
    *,
    node_id: uuid.UUID,
    previous: str,
    current: str,
    last_heartbeat_at: datetime | None,
    decided_by: Literal["sweep", "heartbeat"],
    at: datetime,
) -> None:
    """Store a liveness change with its audit row and event, in the caller's transaction.

    The caller holds the node's event lock (store/locks.py) and has re-read `previous`
    under it, so two deciders can never both record the same transition.
    """
    await session.execute(
        update(Node).where(Node.id == node_id).values(liveness=current, liveness_changed_at=at)
    )
    transition_event(
        session,
        node_id=node_id,
        previous=previous,
        current=current,
        last_heartbeat_at=last_heartbeat_at,
        decided_by=decided_by,
    )


def transition_event(
    session: AsyncSession,
    *,
    node_id: uuid.UUID,
    previous: str,
    current: str,
    last_heartbeat_at: datetime | None,
    decided_by: Literal["sweep", "heartbeat"],
) -> None:
    """The audit row and event of a liveness change whose row the caller has written
    (record_transition, or a batch of them: store/heartbeat.py: record_returns)."""
    change = LivenessChanged(
        node_id=node_id,
        previous=previous,
        current=current,
        last_heartbeat_at=last_heartbeat_at,
        decided_by=decided_by,
    )
    actor = worker_actor("liveness") if decided_by == "sweep" else node_actor(node_id)
    changes.record(session, EventType.NODE_LIVENESS_CHANGED, change, actor=actor)
