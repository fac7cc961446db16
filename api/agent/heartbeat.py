"""Heartbeat: the hottest path. One UPDATE; events and audit only when something changed."""

from __future__ import annotations

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession

from api.agent.auth import AuthenticatedNode, serialize
from api.agent.protocol import require_supported
from schemas.admin import Liveness
from schemas.agent import HeartbeatRequest, HeartbeatResponse
from schemas.events import EventType, NodeAgentChanged, node_actor
from store import changes
from store.liveness import record_transition
from store.models import Node

ONLINE = Liveness.ONLINE.value


def _differs(node: AuthenticatedNode, request: HeartbeatRequest, capabilities: list[str]) -> bool:
    return (
        request.agent_version != node.agent_version
        or request.protocol_version != node.protocol_version
        or capabilities != sorted(set(node.capabilities))
    )


async def record_heartbeat(
    session: AsyncSession,
    node: AuthenticatedNode,
    request: HeartbeatRequest,
    *,
    heartbeat_interval_s: float,
) -> HeartbeatResponse:
    node.require_owns(request.node_id)
    require_supported(request.protocol_version)
    capabilities = sorted(set(request.capabilities))
    if _differs(node, request, capabilities) or node.liveness != ONLINE:
        # An event is coming: take the node lock and decide again on fresh state.
        node = await serialize(session, node)
    changed = _differs(node, request, capabilities)
    values: dict[str, object] = {"last_heartbeat_at": node.received_at}
    if changed:
        values |= {
            "agent_version": request.agent_version,
            "protocol_version": request.protocol_version,
            "capabilities": capabilities,
            "updated_at": node.received_at,
        }
    await session.execute(update(Node).where(Node.id == node.node_id).values(**values))
    if node.liveness != ONLINE:
        # Back (or here for the first time): recorded now, not at the next sweep.
        await record_transition(
            session,
            node_id=node.node_id,
            previous=node.liveness,
            current=ONLINE,
            last_heartbeat_at=node.received_at,
            decided_by="heartbeat",
            at=node.received_at,
        )
    if changed:
        change = NodeAgentChanged(
            node_id=node.node_id,
            agent_version=request.agent_version,
            protocol_version=request.protocol_version,
            capabilities=capabilities,
            previous_agent_version=node.agent_version,
            previous_capabilities=list(node.capabilities),
        )
        changes.record(
            session, EventType.NODE_AGENT_CHANGED, change, actor=node_actor(node.node_id)
        )
    return HeartbeatResponse(
        node_id=node.node_id,
        received_at=node.received_at,
        heartbeat_interval_s=heartbeat_interval_s,
        server_time=node.received_at,
    )
