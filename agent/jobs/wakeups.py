"""The node's end of the job notification channel: one held server-sent-events request
to the API (schemas/protocol.py: NOTIFICATIONS). Each `event: job` names the job's kind
and wakes only the claim loop that can claim it (an artifact job wakes the agent's loop,
a runtime job the runtime worker's); a note without a kind (an older API) wakes every
loop. While the channel is down (API restarting, NATS down, a proxy that cuts long
requests) the loops' polling carries on alone, so nothing depends on it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterable

import httpx

from agent.client import ProtocolClient
from schemas.jobs import JobKind
from schemas.protocol import NOTIFICATIONS

logger = logging.getLogger("modelforge.agent.jobs")

# Longer than the server's keep-alive interval (15 s): silence beyond it is a dead stream.
READ_TIMEOUT_S = 40.0


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
    delay = 0.5
    announced = False
    while not stop.is_set():
        try:
            await _hold(client, wakeups)
            delay = 0.5
        except (httpx.HTTPError, _Refused) as exc:
            if not announced:
                logger.info("job notifications unavailable (%s); polling", type(exc).__name__)
                announced = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
        delay = min(delay * 2, 30.0)


class _Refused(Exception):
    pass


async def _hold(client: ProtocolClient, wakeups: Wakeups) -> None:
    headers = {"Authorization": f"Bearer {client.credential}", "Accept": "text/event-stream"}
    timeout = httpx.Timeout(10.0, read=READ_TIMEOUT_S)
    async with client.http.stream("GET", NOTIFICATIONS, headers=headers, timeout=timeout) as r:
        if r.status_code != 200:
            raise _Refused(f"HTTP {r.status_code}")
        listening = False
        event: str | None = None
        data: list[str] = []
        async for line in r.aiter_lines():
            if not listening:
                # The API sends its first line once the channel is registered: anything
                # created before (while the channel was down) is claimed now, and
                # anything after it is notified.
                listening = True
                logger.info("job notifications: listening")
                wakeups.every()
            if line.startswith("event:"):
                event = line.removeprefix("event:").strip()
            elif line.startswith("data:"):
                data.append(line.removeprefix("data:").strip())
            elif line == "":  # the end of one event
                if event == "job":
                    wakeups.note(note_kind("\n".join(data)))
                event, data = None, []


def note_kind(data: str) -> str | None:
    """The job kind a notification's data names; None when it names none (an older API,
    or data this node cannot read: then every loop claims, which is always safe)."""
    try:
        note = json.loads(data)
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
