"""Node listing, detail and metadata changes."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import exists, select
from sqlalchemy.ext.asyncio import AsyncSession

from api.admin.views import node_detail, node_summary
from api.errors import Conflict, NotFound
from schemas.admin import Liveness, NodeDetail, NodePatch, NodeSummary
from schemas.errors import ErrorCode
from schemas.events import OPERATOR_ACTOR, EventType, NodeEnablementChanged, NodeUpdated
from store import changes, nodes
from store.liveness import LivenessThresholds, liveness_expression
from store.models import Gpu, Node, NodeCredential, NodeStream


async def lock_node(session: AsyncSession, node_id: uuid.UUID) -> Node:
    node = await nodes.lock(session, node_id)
    if node is None:
        raise NotFound(f"node {node_id} does not exist")
    return node


def require_not_terminal(node: Node) -> None:
    if nodes.is_terminal(node):
        raise Conflict(
            "the node was decommissioned; it can no longer be changed",
            code=ErrorCode.NODE_TERMINAL,
        )


def parse_label_filters(raw: list[str]) -> dict[str, str | None]:
    """``key=value`` matches a value; a bare ``key`` matches presence."""
    filters: dict[str, str | None] = {}
    for item in raw:
        key, sep, value = item.partition("=")
        filters[key] = value if sep else None
    return filters


async def list_nodes(
    session: AsyncSession,
    thresholds: LivenessThresholds,
    *,
    liveness: list[Liveness],
    labels: dict[str, str | None],
    limit: int,
    offset: int,
) -> list[NodeSummary]:
    live = liveness_expression(thresholds).label("liveness")
    query = select(Node, live).order_by(Node.enrolled_at, Node.id).limit(limit).offset(offset)
    if liveness:
        query = query.where(live.in_([state.value for state in liveness]))
    for key, value in labels.items():
        if value is None:
            query = query.where(Node.labels.has_key(key))
        else:
            query = query.where(Node.labels.contains({key: value}))
    rows = (await session.execute(query)).all()
    return [node_summary(node, state) for node, state in rows]


async def get_node(
    session: AsyncSession, thresholds: LivenessThresholds, node_id: uuid.UUID
) -> NodeDetail:
    row = await nodes.with_liveness(session, thresholds, node_id)
    if row is None:
        raise NotFound(f"node {node_id} does not exist")
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
    return node_detail(node, liveness, streams, gpus, active)


async def patch_node(
    session: AsyncSession, thresholds: LivenessThresholds, node_id: uuid.UUID, patch: NodePatch
) -> NodeDetail:
    node = await lock_node(session, node_id)
    require_not_terminal(node)
    changed: dict[str, Any] = {}
    if patch.display_name is not None and patch.display_name != node.display_name:
        changed["display_name"] = [node.display_name, patch.display_name]
        node.display_name = patch.display_name
    if patch.labels is not None and dict(patch.labels) != node.labels:
        changed["labels"] = [node.labels, dict(patch.labels)]
        node.labels = dict(patch.labels)
    enablement = patch.enabled is not None and patch.enabled != node.enabled
    if changed:
        changes.record(
            session,
            EventType.NODE_UPDATED,
            NodeUpdated(node_id=node.id, changes=changed),
            actor=OPERATOR_ACTOR,
        )
    if enablement:
        assert patch.enabled is not None
        node.enabled = patch.enabled
        nodes.standing_changed(session, node.id)
        kind = EventType.NODE_ENABLED if patch.enabled else EventType.NODE_DISABLED
        changes.record(
            session,
            kind,
            NodeEnablementChanged(node_id=node.id, enabled=patch.enabled),
            actor=OPERATOR_ACTOR,
        )
    if changed or enablement:
        await session.flush()
    return await get_node(session, thresholds, node_id)
