"""The event fan-out: one core NATS subscription per API process on `modelforge.v1.>`,
fanned out in process to every open viewer of the operators' event stream
(api/admin/events.py: the route). Free of HTTP and of the API's state: the state holds
it (api/state.py), and a route, which reads the state, opens viewers on it.

The relay publishes each outbox event to JetStream, and a core subscriber on the same
subject sees it as it is published. The subscription is held only while someone watches:
an API process nobody watches receives no events at all, which matters at fleet scale,
where every inventory and liveness change is one.

Each viewer has a bounded queue of its own. A viewer that falls that far behind is
dropped (None in its queue, which the route ends with `event: overflow`) rather than
slowing delivery to the others or holding the event in memory without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Final

from nats.aio.msg import Msg

from api.nats_subscription import subscribe_forever
from schemas.events import SUBJECT_PREFIX

logger = logging.getLogger("modelforge.api.admin.events")

SUBJECTS: Final = f"{SUBJECT_PREFIX}.>"
# Events a viewer may have waiting before it is dropped: a terminal that renders a
# table row per event keeps up with bursts far larger than a fleet's usual rate.
QUEUE_LIMIT: Final = 1024


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
