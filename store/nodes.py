"""Node rules that the API and the workers share, in one place.

* `now`: the database clock, the only clock decisions are made by;
* `lock`: a node's event lock, then its row (the order agent requests take too);
* `is_terminal`: a decommissioned node can never change again;
* `schedulable`: the node a new job may be created for;
* `revoke_active_credentials`: the one UPDATE that ends a node's credentials;
* `standing_changed` / `changed_standing`: which nodes this transaction took standing
  from, so that the process that commits it stops admitting them at once;
* `with_liveness`: a node and its computed liveness, in one read.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from schemas.errors import ErrorCode
from store import session_notes
from store.errors import Conflict, Missing
from store.liveness import LivenessThresholds, liveness_expression
from store.locks import node_xact_lock
from store.models import Node, NodeCredential


async def now(session: AsyncSession) -> datetime:
    """The database's statement time: server time, never a host's clock."""
    value: datetime = (await session.execute(select(func.statement_timestamp()))).scalar_one()
    return value


async def lock(session: AsyncSession, node_id: uuid.UUID) -> Node | None:
    """Hold the node's event lock and row lock for the transaction; None if it does not
    exist. The event lock comes first, in the same order agent requests take it."""
    await session.execute(select(node_xact_lock(node_id)))
    return await session.get(Node, node_id, with_for_update=True, populate_existing=True)


def is_terminal(node: Node) -> bool:
    return node.decommissioned_at is not None


async def schedulable(session: AsyncSession, node_id: uuid.UUID, *, locked: bool = False) -> Node:
    """The node, if a job may be created for it: unknown (404), disabled or
    decommissioned (409). With locked=True under its lock (a disable or a decommission
    may have committed since a first check). An offline node's jobs wait for it."""
    node = await (lock(session, node_id) if locked else session.get(Node, node_id))
    if node is None:
        raise Missing(f"no node {node_id}", code=ErrorCode.NOT_FOUND)
    if is_terminal(node) or not node.enabled:
        state = "decommissioned" if is_terminal(node) else "disabled"
        raise Conflict(
            f"the node is {state}: it takes no jobs",
            code=ErrorCode.NODE_NOT_SCHEDULABLE,
            extra={"node_state": state},
        )
    return node


def standing_changed(session: AsyncSession, node_id: uuid.UUID) -> None:
    """Note that this transaction changes whether the node's credential admits it
    (revocation, rotation, disable, decommission).

    Every replica hears of it through the commit's NOTIFY (migration 0006); the process
    that commits it must not wait for its own notification to come back, or it could
    admit a rotated-away credential from its node cache for that moment. It reads this
    note right after the commit (api/deps.py)."""
    session_notes.note(session, session_notes.NODE_STANDING, node_id)


def changed_standing(session: AsyncSession) -> set[uuid.UUID]:
    """The nodes noted by `standing_changed` since the last call (the note is taken)."""
    return session_notes.take(session, session_notes.NODE_STANDING)


async def revoke_active_credentials(
    session: AsyncSession, node_id: uuid.UUID, reason: str, at: datetime
) -> list[uuid.UUID]:
    """Revoke every active credential of the node; the ids revoked."""
    result = await session.execute(
        update(NodeCredential)
        .where(NodeCredential.node_id == node_id, NodeCredential.revoked_at.is_(None))
        .values(revoked_at=at, revoked_reason=reason)
        .returning(NodeCredential.id)
    )
    revoked = list(result.scalars().all())
    if revoked:
        standing_changed(session, node_id)
    return revoked


async def with_liveness(
    session: AsyncSession, thresholds: LivenessThresholds, node_id: uuid.UUID
) -> tuple[Node, str] | None:
    row = (
        await session.execute(
            select(Node, liveness_expression(thresholds)).where(Node.id == node_id)
        )
    ).one_or_none()
    return (row[0], row[1]) if row is not None else None
