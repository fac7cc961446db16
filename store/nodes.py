"""Node rules that the API and the workers share, in one place.

* `now`: the database clock, the only clock decisions are made by;
* `lock`: a node's event lock, then its row (the order agent requests take too);
  `lock_existing` refuses an unknown node (404);
* `is_terminal`: a decommissioned node can never change again; `require_not_terminal`
  refuses changing one (409);
* `schedulable`: the node a new job may be created for;
* `revoke_active_credentials`: the one UPDATE that ends a node's credentials;
* `standing_changed` / `changed_standing`: which nodes this transaction took standing
  from, so that the process that commits it stops admitting them at once;
* `with_liveness`: a node and its computed liveness, in one read;
* `listed`, `detail`, `patch`: an operator's listing, one node's detail, and its
  metadata and enablement changes, each change with its event.

The operator routes build their views from these (api/admin/nodes.py); decommission is
store/decommission.py, a node's credentials store/node_credentials.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import exists, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from schemas.admin import Liveness, NodePatch
from schemas.errors import ErrorCode
from schemas.events import OPERATOR_ACTOR, EventType, NodeEnablementChanged, NodeUpdated
from store import changes, session_notes
from store.errors import Conflict, Missing
from store.liveness import LivenessThresholds, liveness_expression
from store.locks import node_xact_lock
from store.models import Gpu, Node, NodeCredential, NodeStream


async def now(session: AsyncSession) -> datetime:
    """The database's statement time: server time, never a host's clock."""
    value: datetime = (await session.execute(select(func.statement_timestamp()))).scalar_one()
    return value


async def lock(session: AsyncSession, node_id: uuid.UUID) -> Node | None:
    """Hold the node's event lock and row lock for the transaction; None if it does not
    exist. The event lock comes first, in the same order agent requests take it."""
    await session.execute(select(node_xact_lock(node_id)))
    return await session.get(Node, node_id, with_for_update=True, populate_existing=True)


async def lock_existing(session: AsyncSession, node_id: uuid.UUID) -> Node:
    """`lock`, refusing a node that does not exist (404)."""
    node = await lock(session, node_id)
    if node is None:
        raise Missing(f"node {node_id} does not exist", code=ErrorCode.NOT_FOUND)
    return node


def is_terminal(node: Node) -> bool:
    return node.decommissioned_at is not None


def require_not_terminal(node: Node) -> None:
    if is_terminal(node):
        raise Conflict(
            "the node was decommissioned; it can no longer be changed",
            code=ErrorCode.NODE_TERMINAL,
        )


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


async def listed(
    session: AsyncSession,
    thresholds: LivenessThresholds,
    *,
    liveness: Sequence[Liveness],
    labels: Mapping[str, str | None],
    limit: int,
    offset: int,
) -> list[tuple[Node, str]]:
    """Nodes in enrollment order with their computed liveness, filtered by liveness and
    by labels (a value matches that value, None the key's presence)."""
    live = liveness_expression(thresholds).label("liveness")
    query = select(Node, live).order_by(Node.enrolled_at, Node.id).limit(limit).offset(offset)
    if liveness:
        query = query.where(live.in_([state.value for state in liveness]))
    for key, value in labels.items():
        if value is None:
            query = query.where(Node.labels.has_key(key))
        else:
            query = query.where(Node.labels.contains({key: value}))
    return [(node, state) for node, state in (await session.execute(query)).all()]


@dataclass(frozen=True)
class Detail:
    """What an operator's view of one node is built from."""

    node: Node
    liveness: str
    streams: dict[str, NodeStream]
    gpus: list[Gpu]
    has_active_credential: bool


async def detail(
    session: AsyncSession, thresholds: LivenessThresholds, node_id: uuid.UUID
) -> Detail:
    row = await with_liveness(session, thresholds, node_id)
    if row is None:
        raise Missing(f"node {node_id} does not exist", code=ErrorCode.NOT_FOUND)
    streams = {
        stream.stream: stream
        for stream in (
            await session.execute(select(NodeStream).where(NodeStream.node_id == node_id))
        ).scalars()
    }
    gpus = list(
        (
            await session.execute(
                select(Gpu).where(Gpu.node_id == node_id).order_by(Gpu.index, Gpu.uuid)
            )
        ).scalars()
    )
    active = (
        await session.execute(
            select(
                exists().where(
                    NodeCredential.node_id == node_id, NodeCredential.revoked_at.is_(None)
                )
            )
        )
    ).scalar_one()
    node, liveness = row
    return Detail(node, liveness, streams, gpus, active)


async def patch(session: AsyncSession, node_id: uuid.UUID, change: NodePatch) -> None:
    """An operator's change of a node's name, labels or enablement, under its lock; one
    event for the metadata, one for the enablement, none when nothing changed."""
    node = await lock_existing(session, node_id)
    require_not_terminal(node)
    changed: dict[str, Any] = {}
    if change.display_name is not None and change.display_name != node.display_name:
        changed["display_name"] = [node.display_name, change.display_name]
        node.display_name = change.display_name
    if change.labels is not None and dict(change.labels) != node.labels:
        changed["labels"] = [node.labels, dict(change.labels)]
        node.labels = dict(change.labels)
    enablement = change.enabled is not None and change.enabled != node.enabled
    if changed:
        changes.record(
            session,
            EventType.NODE_UPDATED,
            NodeUpdated(node_id=node.id, changes=changed),
            actor=OPERATOR_ACTOR,
        )
    if enablement:
        assert change.enabled is not None
        node.enabled = change.enabled
        standing_changed(session, node.id)
        kind = EventType.NODE_ENABLED if change.enabled else EventType.NODE_DISABLED
        changes.record(
            session,
            kind,
            NodeEnablementChanged(node_id=node.id, enabled=change.enabled),
            actor=OPERATOR_ACTOR,
        )
    if changed or enablement:
        await session.flush()
