"""The node's end of the job notification channel: one held server-sent-events request
to the API (schemas/protocol.py: NOTIFICATIONS). Each `event: job` names the job's kind
and wakes only the claim loop that can claim it (an artifact job wakes the agent's loop,
a runtime job the runtime worker's); a note without a kind (an older API) wakes every
loop. While the channel is down (API restarting, NATS down, a proxy that cuts long
requests) the loops' polling carries on alone, so nothing depends on it.

`hold_events` (a held SSE request, reconnected with backoff) and `EventReader` (its
events, line by line) serve the runtime worker's channel too (agent/runtime/channel.py).

What the API sends is read within bounds: a line or an event longer than
MAX_CHANNEL_EVENT_BYTES ends the request (TooLong: reconnected like a dropped one), and
a note's data is parsed only when it is short and flat, so no answer can hold the
node's memory or reach Python's recursive JSON parser."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Sequence

import httpx

from agent.client import ProtocolClient
from schemas.bounded import depth
from schemas.jobs import JobKind
from schemas.protocol import MAX_CHANNEL_EVENT_BYTES, NOTIFICATIONS

logger = logging.getLogger("modelforge.agent.jobs")

# Longer than the server's keep-alive interval (15 s): silence beyond it is a dead stream.
READ_TIMEOUT_S = 40.0
# A job note is `{"event", "job_id", "kind"}`: anything longer or nested is not one.
MAX_NOTE_BYTES = 1024


class Wakeups:
    """The claim loops of this process, each woken by the kinds it claims."""

    def __init__(self) -> None:
        self._loops: list[tuple[frozenset[str], asyncio.Event]] = []

    def loop_for(self, kinds: Iterable[JobKind]) -> asyncio.Event:
        """The wake-up of a loop that claims these kinds."""
        event = asyncio.Event()
        self._loops.append((frozenset(kind.value for kind in kinds), event))
        return event

    def note(self, kind: str | None) -> None:
        """A notification about a job of this kind (None: the note did not say)."""
        for kinds, event in self._loops:
            if kind is None or kind in kinds:
                event.set()

    def every(self) -> None:
        for _, event in self._loops:
            event.set()


async def listen(client: ProtocolClient, wakeups: Wakeups, stop: asyncio.Event) -> None:
    """Hold NOTIFICATIONS until `stop`: each job note wakes its loops."""

    def on_event(event: str | None, data: str) -> None:
        if event == "job":
            wakeups.note(note_kind(data))

    await hold_events(
        client, [NOTIFICATIONS], stop, on_open=wakeups.every, on_event=on_event,
        what="job notifications",
    )  # fmt: skip


class Refused(Exception):
    """The API answered the held request with something other than 200."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


class TooLong(Exception):
    """A line or an event of the held request passed MAX_CHANNEL_EVENT_BYTES."""


async def hold_events(
    client: ProtocolClient,
    paths: Sequence[str],
    stop: asyncio.Event,
    *,
    on_open: Callable[[], None],
    on_event: Callable[[str | None, str], None],
    what: str,
) -> None:
    """Hold a server-sent-events request until `stop`, reconnecting with backoff: the
    first of `paths` the API serves (a 404 tries the next: an older API), `on_open`
    once its first line arrived, `on_event(event, data)` for each event."""
    delay = 0.5
    announced = False
    while not stop.is_set():
        try:
            for index, path in enumerate(paths):
                try:
                    await _hold(client, path, on_open, on_event, what)
                    break
                except Refused as refused:
                    if refused.status != 404 or index == len(paths) - 1:
                        raise
            delay = 0.5
        except (httpx.HTTPError, Refused, TooLong) as exc:
            if not announced:
                logger.info("%s unavailable (%s); polling", what, type(exc).__name__)
                announced = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
        delay = min(delay * 2, 30.0)


async def _hold(
    client: ProtocolClient,
    path: str,
    on_open: Callable[[], None],
    on_event: Callable[[str | None, str], None],
    what: str,
) -> None:
    headers = {"Authorization": f"Bearer {client.credential}", "Accept": "text/event-stream"}
    timeout = httpx.Timeout(10.0, read=READ_TIMEOUT_S)
    async with client.http.stream("GET", path, headers=headers, timeout=timeout) as r:
        if r.status_code != 200:
            raise Refused(r.status_code)
        listening = False
        reader = EventReader()
        async for line in bounded_lines(r.aiter_bytes(), MAX_CHANNEL_EVENT_BYTES):
            if not listening:
                # The API sends its first line once the channel is registered: anything
                # created before (while the channel was down) is claimed now, and
                # anything after it is notified.
                listening = True
                logger.info("%s: listening", what)
                on_open()
            if (complete := reader.feed(line)) is not None:
                on_event(*complete)


async def bounded_lines(chunks: AsyncIterator[bytes], max_bytes: int) -> AsyncIterator[str]:
    """The lines of a byte stream (`\\n` or `\\r\\n` ended, as the API writes them), or
    TooLong once a line passes `max_bytes` before its end arrives."""
    pending = bytearray()
    async for chunk in chunks:
        pending += chunk
        if b"\n" in chunk:
            *lines, rest = pending.split(b"\n")
            pending = bytearray(rest)
            for line in lines:
                if len(line) > max_bytes:
                    raise TooLong(f"a line longer than {max_bytes} bytes")
                yield line.removesuffix(b"\r").decode("utf-8", errors="replace")
        if len(pending) > max_bytes:
            raise TooLong(f"a line longer than {max_bytes} bytes")
    if pending:
        yield pending.decode("utf-8", errors="replace")


class EventReader:
    """Server-sent events, line by line: `feed` answers (event, data) at the blank line
    that ends an event; comments (keep-alives) and `retry:` are skipped. An event whose
    data passes `max_bytes` raises TooLong."""

    def __init__(self, max_bytes: int = MAX_CHANNEL_EVENT_BYTES) -> None:
        self.max_bytes = max_bytes
        self._event: str | None = None
        self._data: list[str] = []
        self._size = 0

    def feed(self, line: str) -> tuple[str | None, str] | None:
        if line.startswith("event:"):
            self._event = line.removeprefix("event:").strip()
        elif line.startswith("data:"):
            data = line.removeprefix("data:").strip()
            self._size += len(data) + 1
            if self._size > self.max_bytes:
                raise TooLong(f"an event longer than {self.max_bytes} bytes")
            self._data.append(data)
        elif line == "":  # the end of one event
            complete = (self._event, "\n".join(self._data))
            seen = self._event is not None or self._data
            self._event, self._data, self._size = None, [], 0
            return complete if seen else None
        return None


def note_kind(data: str) -> str | None:
    """The job kind a notification's data names; None when it names none (an older API,
    or data this node cannot read: then every loop claims, which is always safe)."""
    raw = data.encode()
    if len(raw) > MAX_NOTE_BYTES or depth(raw) > 1:
        return None
    try:
        note = json.loads(raw)
    except ValueError:
        return None
    kind = note.get("kind") if isinstance(note, dict) else None
    return kind if isinstance(kind, str) else None


async def wait_for_wake(stop: asyncio.Event, wake: asyncio.Event, seconds: float) -> None:
    """Until stop or wake is set, or `seconds` pass; then clear wake for the next round."""
    waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())]
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED), seconds)
    for waiter in waiters:
        waiter.cancel()
    wake.clear()
