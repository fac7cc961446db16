"""Heartbeat: the hottest path, and which way each heartbeat takes.

Routine (the credential is in the node cache, the node is recorded online, nothing in
the request is new): no database round trip at all. The heartbeat is noted in the
group-commit buffer (api/heartbeat_buffer.py) and answered.

Anything else takes the transactional path. A node not in the cache joins the return
batch (api/return_batch.py: many returning nodes in one transaction); what the batch
does not decide, and a cached node's heartbeat that brings news, is decided alone:
authenticate against the database, then the store's rule (store/heartbeat.py:
record_heartbeat): one UPDATE, and the node lock plus an event only when something
changed. After it commits, the node is remembered in the cache, so its next heartbeat
is routine.

The route's dependency (`HeartbeatContext`) picks the way before the body is read: the
cache for a node it holds, else the return batch, shed while the transactional path is
overloaded (api/shedding.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends
from sqlalchemy.ext.asyncio import AsyncSession

from api.agent.auth import authenticate_node, presented_credential, require_credential
from api.deps import NodeAuthorization, State, cached_node
from api.node_cache import CachedNode, cache_entry
from api.state import ApiState
from schemas.agent import HeartbeatRequest, HeartbeatResponse
from schemas.protocol import HEARTBEAT
from store import heartbeat
from store.node_credentials import AuthenticatedNode
from store.secrets import PresentedSecret, digest


def routine(cached: CachedNode, request: HeartbeatRequest) -> bool:
    """Nothing for the database to decide: the cache only holds online nodes."""
    return request.node_id == cached.node_id and not heartbeat.agent_changed(
        cached.agent_version, cached.protocol_version, cached.capabilities, request
    )


def answer_routine(state: ApiState, cached: CachedNode) -> HeartbeatResponse:
    """A routine heartbeat: noted for the group commit, counted, answered."""
    received_at = state.heartbeats.note(cached.node_id)
    state.metrics.heartbeats.labels(path="routine").inc()
    return heartbeat.answer(cached.node_id, received_at, state.settings.heartbeat_interval_s)


@dataclass
class HeartbeatCall:
    """One heartbeat request before its body is looked at: either a node found in the
    cache (a routine candidate) or an open transaction with the node authenticated."""

    state: ApiState
    authorization: str | None
    presented: PresentedSecret
    cached: CachedNode | None = None
    session: AsyncSession | None = None
    node: AuthenticatedNode | None = None
    # Set once the heartbeat is recorded: what to cache after the commit.
    remember: CachedNode | None = None
    # Not in the cache, credential well-formed: for the return batch, no transaction yet.
    returning: bool = False


async def _heartbeat_call(
    state: State, authorization: NodeAuthorization
) -> AsyncIterator[HeartbeatCall]:
    # A cached node needs no transaction; else no node lock up front, taken only when
    # there is an event to emit.
    # A missing or malformed credential is the typed 401 here, before any shedding.
    presented = presented_credential(authorization) or require_credential(authorization)
    cached = cached_node(state, presented)
    if cached is not None:
        yield HeartbeatCall(state, authorization, presented, cached=cached)
        return
    # Not cached: the transactional path, while it is not overloaded (api/shedding.py).
    # Returning (or new, or this process has not seen it): the batch decides it.
    with state.shedder.admitted(HEARTBEAT):
        yield HeartbeatCall(state, authorization, presented, returning=True)


# The heartbeat route's dependency (api/agent/routes.py), committed before the answer.
HeartbeatContext = Annotated[HeartbeatCall, Depends(_heartbeat_call, scope="function")]


@contextlib.asynccontextmanager
async def heartbeat_transaction(
    state: ApiState, authorization: str | None, presented: PresentedSecret
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
    response = await heartbeat.record_heartbeat(
        call.session,
        call.node,
        request,
        heartbeat_interval_s=call.state.settings.heartbeat_interval_s,
    )
    call.remember = cache_entry(call.node, digest(call.presented.secret), request)
    return response


async def handle_heartbeat(call: HeartbeatCall, request: HeartbeatRequest) -> HeartbeatResponse:
    cached = call.cached
    counted = call.state.metrics.heartbeats
    if call.returning:
        response = await call.state.returns.heartbeat(call.presented, request)
        if response is None:
            async with heartbeat_transaction(
                call.state, call.authorization, call.presented
            ) as alone:
                response = await _transactional(alone, request)
        counted.labels(path="transactional").inc()
        return response
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
