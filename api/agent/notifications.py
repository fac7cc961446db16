"""The held request that relays a node's job notifications (api/notifications.py).

Server-sent events rather than long-poll: one request stays open and carries any number
of wake-ups without a reconnect between them, it is plain HTTP/1.1 through proxies, and
the agent reads it with an ordinary streaming GET. No transaction is held while it is
open: the node is authenticated up front (from the node cache, or one short
transaction), and again at every keep-alive, so a revoked, disabled or decommissioned
node's channel closes within one keep-alive interval.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header
from fastapi.responses import StreamingResponse
from sqlalchemy.exc import SQLAlchemyError

from api.agent.auth import admit_cached, authenticate_node, presented_credential
from api.deps import State
from api.errors import ApiError, error_responses
from api.state import ApiState
from schemas.protocol import NOTIFICATIONS

router = APIRouter(tags=["agent"], responses=error_responses(401, 403, 503))

KEEPALIVE_S = 15.0


async def _authenticated(state: ApiState, authorization: str | None) -> uuid.UUID:
    presented = presented_credential(authorization)
    if presented is not None and state.settings.heartbeat_cache:
        cached = state.node_cache.lookup(presented)
        if cached is not None:
            return admit_cached(cached, state.heartbeats.database_now()).node_id
    async with state.sessions() as session, session.begin():
        node = await authenticate_node(session, authorization, serialize=False)
    return node.node_id


@router.get(
    NOTIFICATIONS,
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "the stream"}},
)
async def job_notifications(
    state: State, authorization: Annotated[str | None, Header()] = None
) -> StreamingResponse:
    """Held open: `event: job` whenever the node gets a job or a cancel. Polling
    `…/artifact-jobs/next` alone stays correct; this only cuts the latency."""
    node_id = await _authenticated(state, authorization)
    hub = state.notifications

    async def stream() -> AsyncIterator[str]:
        with hub.channel(node_id) as queue:
            yield "retry: 2000\n: connected\n\n"
            while True:
                try:
                    note = await asyncio.wait_for(queue.get(), KEEPALIVE_S)
                except TimeoutError:
                    try:
                        await _authenticated(state, authorization)
                    except (ApiError, SQLAlchemyError, OSError):
                        return  # refused (or unsure): the channel closes, the agent polls
                    yield ": keep-alive\n\n"
                    continue
                yield f"event: job\ndata: {note}\n\n"

    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )
