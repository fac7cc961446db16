"""Node listing, detail and metadata changes for operators: the query's label filters
parsed, the store's rules called (store/nodes.py: listed, detail, patch), the views
built (api/admin/views.py)."""

from __future__ import annotations

import uuid

from sqlalchemy.ext.asyncio import AsyncSession

from api.admin.views import node_detail, node_summary
from schemas.admin import Liveness, NodeDetail, NodePatch, NodeSummary
from store import nodes
from store.liveness import LivenessThresholds


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
    rows = await nodes.listed(
        session, thresholds, liveness=liveness, labels=labels, limit=limit, offset=offset
    )
    return [node_summary(node, state) for node, state in rows]


async def get_node(
    session: AsyncSession, thresholds: LivenessThresholds, node_id: uuid.UUID
) -> NodeDetail:
    found = await nodes.detail(session, thresholds, node_id)
    return node_detail(
        found.node, found.liveness, found.streams, found.gpus, found.has_active_credential
    )


async def patch_node(
    session: AsyncSession, thresholds: LivenessThresholds, node_id: uuid.UUID, patch: NodePatch
) -> NodeDetail:
    await nodes.patch(session, node_id, patch)
    return await get_node(session, thresholds, node_id)
