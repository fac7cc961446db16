"""The runtime worker's two held requests: its channel, down which job notes, leased
invokes and cancels come (server-sent events), and the answer stream of one invoke,
up which llama-server's answer goes back (a chunked request body). Neither holds a
database transaction while open: the node is authenticated up front (from the node
cache, or one short transaction), and the channel re-checks it at every keep-alive, as
the notification channel does (api/agent/notifications.py). api/gateway/relay.py routes
both between API processes.

The channel is also how the control plane knows the node's runtime worker is there: its
holder writes that to PostgreSQL when it opens, at each keep-alive and when it ends
(store/deployments/runtime_channels.py), in short transactions of their own, and the deployment
reconciler in the workers turns the node's ready deployments `unavailable` once it is
gone (and back when the worker returns), for every process and view to agree."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncGenerator
from typing import Annotated

from fastapi import APIRouter, Header, Request
from fastapi.responses import StreamingResponse
from sqlalchemy.exc import SQLAlchemyError
from starlette.requests import ClientDisconnect

from api.deps import HeldNode, NodeAuthorization, State, node_outside_transaction
from api.errors import ApiError, Conflict, Forbidden, NotFound, error_responses
from api.gateway.relay import Ended, Opened, Verdict, answer_media_type
from api.state import ApiState
from schemas.base import SAFE_INT_MAX, WireModel
from schemas.errors import ErrorCode
from schemas.protocol import (
    INVOKE_EPOCH_HEADER,
    INVOKE_GATEWAY_HEADER,
    INVOKE_LEASE_HEADER,
    INVOKE_STATUS_HEADER,
    INVOKE_STREAM,
    RUNTIME_CHANNEL,
)
from store.deployments import runtime_channels
from store.errors import StoreError

logger = logging.getLogger("modelforge.api.runtime_channel")
router = APIRouter(tags=["agent"], responses=error_responses(401, 403, 503))
# An answer is bounded by its token bound; this only stops a node streaming for ever.
MAX_ANSWER_BYTES = 64 * 1024 * 1024


@router.get(
    RUNTIME_CHANNEL,
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "the stream"}},
)
async def runtime_channel(state: State, authorization: NodeAuthorization) -> StreamingResponse:
    """Held open: `event: job` when the node gets a job or a cancel (as on the
    notification channel), `event: invoke` with a leased invoke, `event: cancel` when
    an invoke's client left."""
    node_id = (await node_outside_transaction(state, authorization)).node_id
    keepalive_s = state.settings.notification_keepalive_s
    channel_id = uuid.uuid4()

    async def stream() -> AsyncGenerator[str, None]:
        loop = asyncio.get_running_loop()
        with state.notifications.channel(node_id) as notes:
            async with state.invokes.channel(node_id) as invokes:
                await _held(state, node_id, channel_id, keepalive_s, opened=True)
                yield "retry: 2000\n: connected\n\n"
                check_at = loop.time() + keepalive_s
                note = asyncio.ensure_future(notes.get())
                work = asyncio.ensure_future(invokes.get())
                try:
                    while True:
                        done, _ = await asyncio.wait(
                            {note, work},
                            timeout=max(0.0, check_at - loop.time()),
                            return_when=asyncio.FIRST_COMPLETED,
                        )
                        if work in done:
                            event, data = work.result()
                            yield f"event: {event}\ndata: {data}\n\n"
                            work = asyncio.ensure_future(invokes.get())
                        if note in done:
                            yield f"event: job\ndata: {note.result()}\n\n"
                            note = asyncio.ensure_future(notes.get())
                        if loop.time() < check_at:
                            continue
                        try:
                            await node_outside_transaction(state, authorization)
                        except (ApiError, StoreError, SQLAlchemyError, OSError):
                            return  # refused (or unsure): the channel closes
                        await _held(state, node_id, channel_id, keepalive_s, opened=False)
                        yield ": keep-alive\n\n"
                        check_at = loop.time() + keepalive_s
                finally:
                    note.cancel()
                    work.cancel()
                    # Often run while cancelled (the worker's connection broke): the
                    # write is a task of its own, which that cancel does not stop.
                    state.invokes.spawn(_ended(state, node_id, channel_id))

    return StreamingResponse(
        state.held_streams.hold(stream()),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


async def _held(
    state: ApiState, node_id: uuid.UUID, channel_id: uuid.UUID, keepalive_s: float, *, opened: bool
) -> None:
    """Record that the channel is held for one more keep-alive. A failed write leaves the
    channel open (invokes still flow): the next keep-alive writes again."""
    try:
        async with state.sessions() as session, session.begin():
            await runtime_channels.held(session, node_id, channel_id, keepalive_s, opened=opened)
    except (SQLAlchemyError, OSError) as exc:
        logger.warning(
            "could not record node %s's runtime channel (%s)", node_id, type(exc).__name__
        )


async def _ended(state: ApiState, node_id: uuid.UUID, channel_id: uuid.UUID) -> None:
    """Record that the channel ended; if this write is lost, the row expires by itself."""
    try:
        async with state.sessions() as session, session.begin():
            await runtime_channels.ended(session, node_id, channel_id)
    except (SQLAlchemyError, OSError) as exc:
        logger.warning(
            "could not record the end of node %s's runtime channel (%s)",
            node_id,
            type(exc).__name__,
        )


class StreamAnswer(WireModel):
    invoke_id: uuid.UUID
    # Every byte of the body reached the invoke's gateway (which may still have lost
    # its client meanwhile).
    accepted: bool
    bytes: int


# A refusal comes before the body is read: closing the connection tells the node at
# once, where a kept-alive one would have the server read (and the node send) the
# whole unwanted answer first.
_CLOSE = {"Connection": "close"}


def _refusal(verdict: Verdict) -> ApiError:
    if verdict == Verdict.NOT_OWNED:
        return Forbidden(
            "this invoke is another node's", code=ErrorCode.JOB_NOT_OWNED, headers=_CLOSE
        )
    if verdict == Verdict.STALE:
        return Conflict(
            "this lease is not the invoke's current one",
            code=ErrorCode.LEASE_STALE,
            headers=_CLOSE,
        )
    return NotFound("no gateway waits on this invoke", code=ErrorCode.NOT_FOUND, headers=_CLOSE)


@router.post(INVOKE_STREAM, responses=error_responses(404, 409))
async def invoke_stream(
    invoke_id: uuid.UUID,
    request: Request,
    state: State,
    lease_id: Annotated[uuid.UUID, Header(alias=INVOKE_LEASE_HEADER)],
    epoch: Annotated[int, Header(alias=INVOKE_EPOCH_HEADER, ge=1, le=SAFE_INT_MAX)],
    gateway: Annotated[str, Header(alias=INVOKE_GATEWAY_HEADER, pattern=r"^[0-9a-f]{32}$")],
    status: Annotated[int, Header(alias=INVOKE_STATUS_HEADER, ge=100, le=599)],
    node: HeldNode,
) -> StreamAnswer:
    """llama-server's answer to a leased invoke, as it comes (the request body), relayed
    to the gateway process that holds the client. Refused before any byte is read: an
    invoke no gateway waits on (404), another node's (403), a lease that is not the
    invoke's current one (409: the gateway retried elsewhere)."""
    node_id = node.node_id
    content_type = answer_media_type(request.headers.get("content-type"))
    verdict, sink = await state.invokes.open_stream(
        node_id=node_id,
        invoke_id=invoke_id,
        gateway=gateway,
        lease_id=lease_id,
        epoch=epoch,
        opened=Opened(status, content_type),
    )
    if sink is None:
        raise _refusal(verdict)
    received = 0
    try:
        async for chunk in request.stream():
            if not chunk:
                continue
            received += len(chunk)
            if received > MAX_ANSWER_BYTES:
                await sink.end(Ended(False, "answer_too_large"))
                return StreamAnswer(invoke_id=invoke_id, accepted=False, bytes=received)
            await sink.data(chunk)
    except ClientDisconnect:
        # The runtime worker (or its host) went away mid-answer.
        await sink.end(Ended(False, "node_lost"))
        return StreamAnswer(invoke_id=invoke_id, accepted=False, bytes=received)  # unread
    await sink.end(Ended(True))
    return StreamAnswer(invoke_id=invoke_id, accepted=True, bytes=received)
