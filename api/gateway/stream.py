"""A streamed answer once its first chunk came (api/gateway/call.py waited for it, so a
deployment that failed before then was retried elsewhere): from here the stream is the
client's.

* The node's frames are relayed as they come, through the tally (api/gateway/tally.py:
  usage counted, the usage event taken out when the client did not ask for it).
* A gap past the token-gap bound, or the node lost, ends it with a terminal SSE error
  event (a partial line is dropped first), and the deployment cools down.
* What it leaves behind (its outcome metered, the node told to stop when the client
  left, the deployment's count in flight, its measurement) is undone once, however the
  response ends, even when its body never starts (`RelayedStream`, `StreamEnding`).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from api.gateway.measurements import GatewayMeasurements
from api.gateway.relay import Ended, InvokeRelay, Pending
from api.gateway.routing import Choice
from api.gateway.tally import StreamTally
from api.gateway.usage import CLIENT_LEFT, OK
from api.handlers import gateway_error
from schemas.errors import ErrorBody, ErrorCode
from store.correlation import current_correlation_id


class StreamingCall(Protocol):
    """What of a call (api/gateway/call.py: Call) its stream uses."""

    relay: InvokeRelay
    invoke_id: uuid.UUID
    model: str | None
    measured: GatewayMeasurements

    async def frame(self, pending: Pending, timeout_s: float) -> object | None: ...

    def cool_down(self, choice: Choice, reason: str) -> None: ...

    def outcome(self, outcome: str, tokens: tuple[int, int] = (0, 0)) -> None: ...


class RelayedStream(StreamingResponse):
    """A relayed stream whose cleanup runs however the response ends, including when
    its body never starts (the client left before the headers went out): a generator's
    `finally` runs only once the generator has started."""

    def __init__(self, content: AsyncIterator[bytes], cleanup: Callable[[], Awaitable[None]],
                 headers: dict[str, str]) -> None:  # fmt: skip
        super().__init__(content, media_type="text/event-stream", headers=headers)
        self._cleanups: list[Callable[[], Awaitable[None] | None]] = [cleanup]

    def on_finish(self, release: Callable[[], None]) -> None:
        self._cleanups.append(release)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            for cleanup in self._cleanups:
                done = cleanup()
                if done is not None:
                    await done


class StreamEnding:
    """What a relayed stream leaves behind, undone once however the stream ends."""

    def __init__(
        self, call: StreamingCall, pending: Pending, choice: Choice, tally: StreamTally
    ) -> None:
        self.call = call
        self.pending = pending
        self.route = choice.route
        self.tally = tally
        self.finished = False
        self._closed = False

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        relay = self.call.relay
        # Unless the stream ended first (ok, or its error event): the client left it,
        # or read it whole and closed before the node's end frame came (ok all the same).
        whole = self.tally.done
        self.call.outcome(OK if whole else CLIENT_LEFT, self.tally.tokens)
        try:
            if not self.finished and not whole:
                # The client left (or never read): stop the node's work at once.
                await relay.cancel(self.route.node_id, self.call.invoke_id)
        finally:
            relay.forget(self.pending)
            relay.in_flight[self.route.deployment_id] -= 1
            if self.call.model is not None:
                self.call.measured.ended(self.call.model)


async def relay_stream(
    call: StreamingCall,
    pending: Pending,
    choice: Choice,
    first: bytes,
    ending: StreamEnding,
    gap_s: float,
) -> AsyncIterator[bytes]:
    """The client's events, from the first chunk on; `gap_s`: the bound between two."""
    tally = ending.tally
    out = tally.feed(first)
    if out:
        yield out
    while True:
        frame = await call.frame(pending, gap_s)
        if isinstance(frame, bytes):
            out = tally.feed(frame)
            if out:
                yield out
            continue
        if isinstance(frame, Ended) and frame.ok:
            out = tally.end()
            ending.finished = True
            call.outcome(OK, tally.tokens)
            if out:
                yield out
            return
        # A partial line is dropped: sent, it would run into the error event's line.
        tally.end()
        code = ErrorCode.TOKEN_GAP_TIMEOUT if frame is None else ErrorCode.NODE_LOST
        call.cool_down(choice, code.value)
        call.outcome(code.value, tally.tokens)
        yield stream_error(code, "the deployment stopped answering mid-stream")
        return


def stream_error(code: ErrorCode, message: str) -> bytes:
    """A stream's terminal error event: the envelope of every /v1 refusal."""
    body = ErrorBody(code=code, message=message, correlation_id=current_correlation_id() or "")
    return f"data: {gateway_error(502, body).model_dump_json()}\n\n".encode()
