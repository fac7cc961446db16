"""The operators' event stream (ADMIN_EVENTS, schemas/protocol.py): every CloudEvent as
the relay publishes it, as server-sent events, for `modelforge admin … --watch` and, later,
the dashboard.

The events come from the process's fan-out (api/event_fanout.py: one NATS subscription,
held only while someone watches, a bounded queue per viewer). A viewer dropped for
falling behind gets a last `event: overflow`; it may reconnect and read the state it
missed through the list routes. No database session is held per viewer: the operator
key was checked before the stream opened (the router's dependency), and the events
come from NATS alone.

The stream does not outlive its credential: the same operator check runs again at
every keep-alive (api/held_streams.py: rechecked), in memory, so a stream opened with a
dashboard session ends within one keep-alive of its logout (heard from any API process,
api/ui/revocations.py) or its expiry. The operator key is the process's setting: a key
change is a restart, which ends every stream (the reconnect with the old key is refused).

Resume: a viewer that reconnects with `Last-Event-ID` (an EventSource does by itself,
`modelforge admin … -w` too) first gets what was published after that event, read
once from the outbox (store/published.py), then the live stream, each event once. An
unknown id, or more than REPLAY_LIMIT events since, ends the stream with
`event: overflow` at once: re-read the state through the list routes and reconnect
without it. Without the header the stream is live only; the stream
(`modelforge events tail --from-start`) and the audit log hold the history. An event
the relay republishes after a crash reaches viewers twice with the same `id:`.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncGenerator
from typing import Annotated, Final

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse

from api.deps import State, require_operator
from api.errors import ApiError
from api.event_fanout import EventFilter, envelope_message, message_id
from api.held_streams import Tick, rechecked
from api.state import ApiState
from schemas.base import FilterText, ShortText
from schemas.protocol import ADMIN_EVENTS, ADMIN_EVENTS_OVERFLOW, ADMIN_HEADER
from store.published import published_after

# How long a new viewer's stream waits for the subscription before it opens anyway
# (NATS down: the stream then stays quiet until the subscription comes back).
READY_WAIT_S: Final = 5.0
# Events a resuming viewer may have missed and still be caught up with (Last-Event-ID);
# beyond, it re-reads the state instead.
REPLAY_LIMIT: Final = 1000


async def _missed(state: ApiState, last_event_id: str, wanted: EventFilter) -> list[str] | None:
    """The messages a resuming viewer missed, or None: it must re-read the state."""
    try:
        after = uuid.UUID(last_event_id)
    except ValueError:
        return None
    async with state.sessions() as session, session.begin():
        envelopes = await published_after(session, after, limit=REPLAY_LIMIT + 1)
    if envelopes is None or len(envelopes) > REPLAY_LIMIT:
        return None
    missed = []
    for envelope in envelopes:
        message = envelope_message(envelope)
        if message is not None and wanted.admits(envelope):
            missed.append(message)
    return missed


router = APIRouter()


@router.get(
    ADMIN_EVENTS,
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "the stream"}},
)
async def admin_events(
    request: Request,
    state: State,
    node_id: uuid.UUID | None = None,
    type: Annotated[
        FilterText | None, Query(description="action or CloudEvent type prefix")
    ] = None,
    last_event_id: Annotated[
        ShortText | None,
        Header(description="resume after this event (the `id:` of the last one seen)"),
    ] = None,
) -> StreamingResponse:
    """Held open: one message per CloudEvent published while it is, comments as
    keep-alives; with Last-Event-ID, first those published since that one. Ends when
    the API stops, within a keep-alive of its credential's end (a dashboard logout or
    expiry), or with `event: overflow` for a viewer too slow to keep up or too far
    behind to resume."""
    fanout = state.events
    keepalive_s = state.settings.notification_keepalive_s
    wanted = EventFilter(node_id=node_id, type_prefix=type)
    overflow = f"event: {ADMIN_EVENTS_OVERFLOW}\ndata: {{}}\n\n"
    presented = request.headers.get(ADMIN_HEADER)

    async def admitted() -> bool:
        # The router's own check, again: the key, else the session cookie (revoked or
        # expired by now?). Memory only, no database.
        try:
            await require_operator(request, state, presented)
        except ApiError:
            return False
        return True

    async def stream() -> AsyncGenerator[str, None]:
        with fanout.viewer(wanted) as viewer:
            subscribed = await fanout.wait_subscribed(READY_WAIT_S)
            yield "retry: 2000\n: connected\n\n" if subscribed else "retry: 2000\n: waiting\n\n"
            # Read after the subscription began: whatever is published from here on is
            # in the queue too, so nothing falls between the two (duplicates are skipped).
            replayed: set[str] = set()
            if last_event_id is not None:
                missed = await _missed(state, last_event_id, wanted)
                if missed is None:
                    yield overflow
                    return
                for caught_up in missed:
                    replayed.add(message_id(caught_up))
                    yield caught_up
            live = rechecked(viewer.queue.get, keepalive_s, admitted)
            async with contextlib.aclosing(live):
                async for message in live:
                    if message is Tick.KEEP_ALIVE:
                        yield ": keep-alive\n\n"
                        continue
                    if message is None:
                        yield overflow
                        return
                    if replayed and message_id(message) in replayed:
                        continue
                    yield message

    return StreamingResponse(
        state.held_streams.hold(stream()),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )
