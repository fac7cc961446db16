"""Heartbeat: the hottest path.

Routine (the credential is in the node cache, the node is recorded online, nothing in
the request is new): no database round trip at all. The heartbeat is noted in the
group-commit buffer (api/heartbeat_buffer.py) and answered.

Anything else takes the transactional path: authenticate against the database, one
UPDATE, and the node lock plus an event only when something changed (the node comes
back online, or the agent's facts changed). After it commits, the node is remembered
in the cache, so its next heartbeat is routine.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession

from api.agent.auth import AuthenticatedNode, authenticate_node, serialize
from api.node_cache import CachedNode
from api.state import ApiState
from schemas.admin import Liveness
from schemas.agent import HeartbeatRequest, HeartbeatResponse
from schemas.events import EventType, NodeAgentChanged, node_actor
from store import changes
from store.liveness import record_transition
from store.models import Node
from store.protocol_versions import require_supported
from store.secrets import PresentedSecret, digest

ONLINE = Liveness.ONLINE.value


def _differs(node: AuthenticatedNode, request: HeartbeatRequest) -> bool:
    return _differs_from(node.agent_version, node.protocol_version, node.capabilities, request)


def routine(cached: CachedNode, request: HeartbeatRequest) -> bool:
    """Nothing for the database to decide: the cache only holds online nodes."""
    return request.node_id == cached.node_id and not _differs_from(
        cached.agent_version, cached.protocol_version, list(cached.capabilities), request
    )


def _differs_from(
    agent_version: str, protocol_version: int, capabilities: list[str], request: HeartbeatRequest
) -> bool:
    return (
        request.agent_version != agent_version
        or request.protocol_version != protocol_version
        or sorted(set(request.capabilities)) != sorted(set(capabilities))
    )


def cache_entry(
    node: AuthenticatedNode, presented: PresentedSecret, request: HeartbeatRequest
) -> CachedNode:
    """The node as a committed heartbeat left it: online, with the request's facts."""
    return CachedNode(
        node_id=node.node_id,
        credential_id=node.credential_id,
        digest=digest(presented.secret),
        agent_version=request.agent_version,
        protocol_version=request.protocol_version,
        capabilities=tuple(sorted(set(request.capabilities))),
    )


def answer_routine(state: ApiState, cached: CachedNode) -> HeartbeatResponse:
    """A routine heartbeat: noted for the group commit, counted, answered."""
    received_at = state.heartbeats.note(cached.node_id)
    state.metrics.heartbeats.labels(path="routine").inc()
    return answer(cached.node_id, received_at, state.settings.heartbeat_interval_s)


def answer(node_id: uuid.UUID, received_at: datetime, interval_s: float) -> HeartbeatResponse:
    return HeartbeatResponse(
        node_id=node_id,
        received_at=received_at,
        heartbeat_interval_s=interval_s,
        server_time=received_at,
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
    if _differs(node, request) or node.liveness != ONLINE:
        # An event is coming: take the node lock and decide again on fresh state.
        node = await serialize(session, node)
    changed = _differs(node, request)
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
    return answer(node.node_id, node.received_at, heartbeat_interval_s)


@dataclass
class HeartbeatCall:
    """One heartbeat request before its body is looked at: either a node found in the
    cache (a routine candidate) or an open transaction with the node authenticated."""

    state: ApiState
    authorization: str | None
    presented: PresentedSecret | None
    cached: CachedNode | None = None
    session: AsyncSession | None = None
    node: AuthenticatedNode | None = None
    # Set once the heartbeat is recorded: what to cache after the commit.
    remember: CachedNode | None = None


@contextlib.asynccontextmanager
async def heartbeat_transaction(
    state: ApiState, authorization: str | None, presented: PresentedSecret | None
) -> AsyncIterator[HeartbeatCall]:
    """The transactional path; the node is cached only after the commit, and only if no
    change notification arrived since the read began (api/node_cache.py)."""
    generation = state.node_cache.generation
    async with state.sessions() as session, session.begin():
        node = await authenticate_node(session, authorization, serialize=False)
        call = HeartbeatCall(state, authorization, presented, session=session, node=node)
        yield call
    state.heartbeats.observe(node.received_at)
    if call.remember is not None and state.settings.heartbeat_cache:
        state.node_cache.remember(call.remember, generation)


async def _transactional(call: HeartbeatCall, request: HeartbeatRequest) -> HeartbeatResponse:
    assert call.session is not None and call.node is not None
    response = await record_heartbeat(
        call.session,
        call.node,
        request,
        heartbeat_interval_s=call.state.settings.heartbeat_interval_s,
    )
    if call.presented is not None:
        call.remember = cache_entry(call.node, call.presented, request)
    return response


async def handle_heartbeat(call: HeartbeatCall, request: HeartbeatRequest) -> HeartbeatResponse:
    cached = call.cached
    counted = call.state.metrics.heartbeats
    if cached is None:
        response = await _transactional(call, request)
        counted.labels(path="transactional").inc()
        return response
    if routine(cached, request):
        return answer_routine(call.state, cached)
    # Cached, but the request brings something new (or names another node, which the
    # transactional path refuses): decide it in a transaction of its own.
    async with heartbeat_transaction(call.state, call.authorization, call.presented) as inner:
        response = await _transactional(inner, request)
    counted.labels(path="transactional").inc()
    return response
