"""Liveness from server-received heartbeat time (never the agent's clock).

Reads compute it from the timestamp; transitions are recorded on the node (with an
audit row and an event) by the sweep in workers/liveness.py and by heartbeats.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from sqlalchemy import ColumnElement, case, func, literal, text, update
from sqlalchemy.ext.asyncio import AsyncSession

from schemas.events import EventType, LivenessChanged
from store import audit, outbox
from store.models import Node


@dataclass(frozen=True)
class LivenessThresholds:
    stale_after_s: float
    offline_after_s: float


def liveness_expression(thresholds: LivenessThresholds) -> ColumnElement[str]:
    """SQL for a node's liveness, evaluated against the database clock."""
    now = func.statement_timestamp()
    stale = func.make_interval(0, 0, 0, 0, 0, 0, literal(thresholds.stale_after_s))
    offline = func.make_interval(0, 0, 0, 0, 0, 0, literal(thresholds.offline_after_s))
    return case(
        (Node.decommissioned_at.is_not(None), text("'decommissioned'")),
        (Node.enabled.is_(False), text("'disabled'")),
        (Node.last_heartbeat_at.is_(None), text("'offline'")),
        (Node.last_heartbeat_at > now - stale, text("'online'")),
        (Node.last_heartbeat_at > now - offline, text("'stale'")),
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
    change = LivenessChanged(
        node_id=node_id,
        previous=previous,
        current=current,
        last_heartbeat_at=last_heartbeat_at,
        decided_by=decided_by,
    )
    audit.record(
        session,
        actor=audit.SYSTEM if decided_by == "sweep" else audit.node_actor(node_id),
        action=EventType.NODE_LIVENESS_CHANGED.value,
        target_type="node",
        target_id=node_id,
        details=change.model_dump(mode="json", exclude={"node_id"}),
    )
    outbox.emit(
        session, EventType.NODE_LIVENESS_CHANGED, target_id=node_id, node_id=node_id, payload=change
    )
