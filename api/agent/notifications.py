"""The held request that relays a node's job notifications (api/notifications.py).

Server-sent events rather than long-poll: one request stays open and carries any number
of wake-ups without a reconnect between them, it is plain HTTP/1.1 through proxies, and
the agent reads it with an ordinary streaming GET. No transaction is held while it is
open: the node is authenticated up front (from the node cache, or one short
transaction), and again at every keep-alive, so a revoked, disabled or decommissioned
node's channel closes within one keep-alive interval (`notification_keepalive_s`). Every
channel ends when the API begins to stop (api/held_streams.py), so the agent reconnects
to another replica and the API stops at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator

from fastapi import APIRouter
from fastapi.responses import StreamingResponse
from sqlalchemy.exc import SQLAlchemyError

from api.deps import NodeAuthorization, State, node_outside_transaction
from api.errors import ApiError, error_responses
from api.held_streams import Tick, rechecked
from schemas.protocol import NOTIFICATIONS
from store.errors import StoreError

router = APIRouter(tags=["agent"], responses=error_responses(401, 403, 503))


@router.get(
    NOTIFICATIONS,
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "the stream"}},
)
async def job_notifications(state: State, authorization: NodeAuthorization) -> StreamingResponse:
    """Held open: `event: job` whenever the node gets a job or a cancel. Polling
    `…/artifact-jobs/next` alone stays correct; this only cuts the latency."""
    node_id = (await node_outside_transaction(state, authorization)).node_id
    keepalive_s = state.settings.notification_keepalive_s
    hub = state.notifications

    async def admitted() -> bool:
        try:
            await node_outside_transaction(state, authorization)
        except (ApiError, StoreError, SQLAlchemyError, OSError):
            return False  # refused (or unsure): the channel closes, the agent polls
        return True

    async def stream() -> AsyncGenerator[str, None]:
        with hub.channel(node_id) as queue:
            yield "retry: 2000\n: connected\n\n"
            notes = rechecked(queue.get, keepalive_s, admitted)
            async with contextlib.aclosing(notes):
                async for note in notes:
                    if note is Tick.KEEP_ALIVE:
                        yield ": keep-alive\n\n"
                    else:
                        yield f"event: job\ndata: {note}\n\n"

    return StreamingResponse(
        state.held_streams.hold(stream()),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )
