"""The operators' event stream (ADMIN_EVENTS, schemas/protocol.py): every CloudEvent as
the relay publishes it, as server-sent events, for `modelforge admin … --watch` and, later,
the dashboard.

One core NATS subscription per API process on `modelforge.v1.>` (the relay publishes
each outbox event to JetStream, and a core subscriber on the same subject sees it as it
is published), fanned out in process to every open viewer. The subscription is held only
while someone watches: an API process nobody watches receives no events at all, which
matters at fleet scale, where every inventory and liveness change is one.

Each viewer has a bounded queue of its own. A viewer that falls that far behind is
dropped, with a last `event: overflow`, rather than slowing delivery to the others or
holding the event in memory without bound; it may reconnect and read the state it
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

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Annotated, Final

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse
from nats.aio.msg import Msg

from api.deps import State, require_operator
from api.errors import ApiError
from api.held_streams import Tick, rechecked
from api.nats_subscription import subscribe_forever
from api.state import ApiState
from schemas.base import FilterText, ShortText
from schemas.events import SUBJECT_PREFIX
from schemas.protocol import ADMIN_EVENTS, ADMIN_EVENTS_OVERFLOW, ADMIN_HEADER
from store.published import published_after

logger = logging.getLogger("modelforge.api.admin.events")

SUBJECTS: Final = f"{SUBJECT_PREFIX}.>"
# Events a viewer may have waiting before it is dropped: a terminal that renders a
# table row per event keeps up with bursts far larger than a fleet's usual rate.
QUEUE_LIMIT: Final = 1024
# How long a new viewer's stream waits for the subscription before it opens anyway
# (NATS down: the stream then stays quiet until the subscription comes back).
READY_WAIT_S: Final = 5.0
# Events a resuming viewer may have missed and still be caught up with (Last-Event-ID);
# beyond, it re-reads the state instead.
REPLAY_LIMIT: Final = 1000


@dataclass(frozen=True)
class EventFilter:
    node_id: uuid.UUID | None = None
    # Matches the event's action (`node.disabled`) or its CloudEvent type
    # (`io.modelforge.node.disabled.v1`) by prefix.
    type_prefix: str | None = None

    def admits(self, envelope: dict[str, object]) -> bool:
        if self.node_id is not None and envelope.get("nodeid") != str(self.node_id):
            return False
        if self.type_prefix is None:
            return True
        return any(
            isinstance(value, str) and value.startswith(self.type_prefix)
            for value in (envelope.get("action"), envelope.get("type"))
        )


@dataclass(eq=False)
class Viewer:
    """One open stream. None in its queue means it overflowed and was dropped."""

    wanted: EventFilter
    queue: asyncio.Queue[str | None] = field(default_factory=asyncio.Queue)


def sse_message(data: bytes) -> tuple[dict[str, object], str] | None:
    """The envelope and its SSE message, or None for what is not a CloudEvent."""
    try:
        envelope = json.loads(data)
        event_id, event_type = envelope["id"], envelope["type"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(envelope, dict) or not isinstance(event_type, str):
        return None
    # SSE ends a field at a newline: the JSON must sit on one line.
    text = json.dumps(envelope, separators=(",", ":")) if b"\n" in data else data.decode()
    return envelope, f"id: {event_id}\nevent: {event_type}\ndata: {text}\n\n"


def envelope_message(envelope: dict[str, object]) -> str | None:
    """The SSE message of an envelope already parsed (read back from the outbox), as
    sse_message builds it, or None for what is not a CloudEvent."""
    if "id" not in envelope or not isinstance(event_type := envelope.get("type"), str):
        return None
    text = json.dumps(envelope, separators=(",", ":"))
    return f"id: {envelope['id']}\nevent: {event_type}\ndata: {text}\n\n"


def message_id(message: str) -> str:
    """The `id:` of a message sse_message built."""
    return message.split("\n", 1)[0].removeprefix("id: ")


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


class EventFanout:
    """One subscription fanned out to bounded per-viewer queues. Free of HTTP, so the
    dashboard's stream can open viewers on it too."""

    def __init__(self, nats_url: str, *, queue_limit: int = QUEUE_LIMIT) -> None:
        self._url = nats_url
        self._queue_limit = queue_limit
        self._viewers: set[Viewer] = set()
        # The subscription of the viewers now open; each start has its own events, so a
        # stopping one never clears the readiness of the next.
        self._run: _Run | None = None
        # Runs told to stop, held until they end (the loop keeps only weak references).
        self._stopping: set[asyncio.Task[None]] = set()
        self.delivered = 0
        self.dropped = 0

    @property
    def viewers(self) -> int:
        return len(self._viewers)

    @property
    def subscribed(self) -> bool:
        return self._run is not None and self._run.ready.is_set()

    async def wait_subscribed(self, timeout_s: float) -> bool:
        run = self._run
        if run is None:
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(run.ready.wait(), timeout_s)
        return run.ready.is_set()

    @contextlib.contextmanager
    def viewer(self, wanted: EventFilter) -> Iterator[Viewer]:
        """Register a viewer; the first one starts the subscription, the last one to
        leave stops it."""
        viewer = Viewer(wanted)
        self._viewers.add(viewer)
        if self._run is None:
            self._run = _Run.start(self._url, self._on_message)
        try:
            yield viewer
        finally:
            self._viewers.discard(viewer)
            if not self._viewers and self._run is not None:
                # It ends by itself (within a second); not awaited on the request's path.
                self._run.stop.set()
                self._stopping.add(self._run.task)
                self._run.task.add_done_callback(self._stopping.discard)
                self._run = None

    def deliver(self, data: bytes) -> None:
        parsed = sse_message(data)
        if parsed is None:
            return
        envelope, message = parsed
        for viewer in list(self._viewers):
            if not viewer.wanted.admits(envelope):
                continue
            if viewer.queue.qsize() >= self._queue_limit:
                # Dropped, not waited for: one slow terminal never delays the rest.
                self._viewers.discard(viewer)
                viewer.queue.put_nowait(None)
                self.dropped += 1
                continue
            viewer.queue.put_nowait(message)
            self.delivered += 1

    async def _on_message(self, message: Msg) -> None:
        self.deliver(message.data)

    async def close(self) -> None:
        run, self._run = self._run, None
        tasks = set(self._stopping)
        if run is not None:
            run.stop.set()
            tasks.add(run.task)
        if tasks:
            # A connect attempt in progress (NATS down) is not waited out.
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.gather(*tasks), 2)


@dataclass(frozen=True)
class _Run:
    task: asyncio.Task[None]
    ready: asyncio.Event
    stop: asyncio.Event

    @classmethod
    def start(cls, nats_url: str, callback: Callable[[Msg], Awaitable[None]]) -> _Run:
        ready, stop = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(
            subscribe_forever(
                nats_url,
                SUBJECTS,
                callback,
                ready=ready,
                stop=stop,
                client_name="modelforge-api-admin-events",
                label="admin events",
                logger=logger,
            )
        )
        return cls(task, ready, stop)


@contextlib.asynccontextmanager
async def event_fanout(nats_url: str) -> AsyncIterator[EventFanout]:
    """The process's fan-out, for the lifespan; its subscription ends with it."""
    fanout = EventFanout(nats_url)
    try:
        yield fanout
    finally:
        await fanout.close()


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
