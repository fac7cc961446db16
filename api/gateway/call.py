"""The gateway's call machinery, the same for every endpoint (chat, completions,
embeddings): a request, once its endpoint's route (api/gateway/routes.py,
completions.py, embeddings.py) validated it and built its invoke params
(api/gateway/params.py), becomes a deployment.invoke.v1 for a ready deployment that
serves the endpoint and the client's scope allows, chosen by api/gateway/routing.py,
delivered with its lease on the node's runtime channel and answered over the node's
answer stream (api/gateway/relay.py). Per request:

* **Before the first byte** reaches the client, a deployment that cannot take the
  invoke (no channel, busy, draining, not loaded, not serving the endpoint), or that
  passes the time-to-first-token bound, is left for the next one (up to
  `gateway_attempts`); one that failed or timed out cools down for
  `gateway_cooldown_s` (written off the hot path, shown in the admin API). After the
  first byte the stream is the client's (api/gateway/stream.py), and a failure ends it
  with a terminal SSE error event (a plain answer has no first byte until it is whole).
* The time to first token and the gap between tokens are separate bounds.
* 404 only for a model or role nothing serves at that endpoint; 503 with Retry-After
  when none is ready; 429 with Retry-After past the client's bounds or when every
  deployment is busy; 422 `tools_unsupported` (param `tools`) for tools no deployment
  of the model can call (its chat template has no tool calls: llama-server would
  ignore them).
* A plain answer is held whole before it goes out, up to MAX_PLAIN_ANSWER_BYTES: past
  it the invoke is cancelled and the client refused 502 `upstream_too_large`.
* A client that disconnects cancels its invoke at once (the node closes llama-server's
  connection, which frees the device), whenever it leaves: while the gateway waits for
  the answer to open (ASGI's http.disconnect, watched from the delivery on), or once
  the stream is the client's (the response sees its send fail).
* Every answer carries route receipts: deployment, node, device, why it was chosen,
  and the gateway's own overhead (arrival to delivery) in ms.
* Every request of an authenticated client is metered once, whatever ends it
  (api/gateway/usage.py), whatever its endpoint, with the tokens the node reported
  (api/gateway/tally.py: a stream always asks the node for its usage); a client whose
  tokens today reached its budget is refused 429 budget_exhausted until the next UTC
  day, at every endpoint (api/gateway/serve.py, before the call).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from dataclasses import dataclass
from typing import Any, Final, NoReturn

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from pydantic import ValidationError

from api.errors import (
    BadGateway,
    NotFound,
    ServiceUnavailable,
    TooManyRequests,
)
from api.gateway.relay import Ended, Frame, Opened, Pending
from api.gateway.routing import Choice, order
from api.gateway.stream import RelayedStream, StreamEnding, relay_stream
from api.gateway.tally import StreamTally, bounded, plain_usage
from api.gateway.usage import OK, InvokeMeter
from api.handlers import error_response
from api.state import ApiState
from schemas.endpoints import Endpoint
from schemas.errors import ErrorBody, ErrorCode, FieldError
from schemas.gateway import RETRYABLE_REFUSALS, Invoke, InvokeBody, InvokeRefusal
from schemas.jobs import LeaseFence
from schemas.protocol import (
    ROUTE_DEPLOYMENT_HEADER,
    ROUTE_DEVICE_HEADER,
    ROUTE_NODE_HEADER,
    ROUTE_OVERHEAD_HEADER,
    ROUTE_REASON_HEADER,
)
from store.correlation import current_correlation_id
from store.deployments import routing as deployment_routes
from store.deployments import rules as deployments
from store.errors import Invalid

logger = logging.getLogger("modelforge.api.gateway")

RETRY_NOT_READY_S = 5
# A plain answer is held whole before it goes out (it is retried elsewhere until then):
# 256 embeddings of 4096 dimensions as JSON floats are ~20 MB.
MAX_PLAIN_ANSWER_BYTES: Final = 32 * 1024 * 1024
# A refusal, or llama-server's own error passed on, is read for its code and usage:
# either is a few hundred bytes. Past this the rest is not read (the node is untrusted).
MAX_REFUSAL_BYTES: Final = 1024 * 1024
_rng = random.SystemRandom()


@dataclass(frozen=True)
class CallSpec:
    """What one validated request asks of the call machinery, whatever its endpoint."""

    endpoint: Endpoint
    model: str
    stream: bool
    params: InvokeBody
    # The prompt's texts and the completion bound (all choices together): what the
    # node's usage is held to.
    texts: list[str]
    max_tokens: int
    # Take a chat stream's usage event (`choices: []`) out: the client did not ask.
    strip_usage: bool
    # A chat request whose tools may be called: only deployments that call tools.
    needs_tools: bool = False
    # Answers generated one after another before the first byte comes back (a plain
    # completion of several prompts, agent/runtime/completion_list.py): the wait for
    # the first byte is the first-token bound times this.
    answers_in_turn: int = 1


class FieldRefused(Exception):
    """A 422 naming a request field, decided after routing (tools no route can call)."""

    def __init__(self, code: ErrorCode, field: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.field = field
        self.message = message

    def response(self, path: str) -> Response:
        body = ErrorBody(
            code=self.code,
            message=self.message,
            correlation_id=current_correlation_id() or "",
            details=[FieldError(location=["body", self.field], message=self.message,
                                type=self.code.value)],
        )  # fmt: skip
        return error_response(path, 422, body)


class _ClientLeft(Exception):
    """The client closed its connection before its answer was handed to it."""


class Call:
    def __init__(
        self,
        state: ApiState,
        spec: CallSpec,
        arrived: float,
        meter: InvokeMeter,
    ) -> None:
        self.state = state
        self.meter = meter
        self.spec = spec
        self.arrived = arrived
        self.relay = state.invokes
        self.settings = state.settings
        self.stream = spec.stream
        self.invoke_id = uuid.uuid4()
        # The served model the invoke went to (its first route's), once routes are known:
        # what its measurements count under (api/gateway/measurements.py).
        self.model: str | None = None
        self.measured = state.measurements
        # Done once the client has left (http.disconnect); watched by every wait before
        # the response is handed back.
        self.gone: asyncio.Future[None] | None = None

    def outcome(self, outcome: str, tokens: tuple[int, int] = (0, 0)) -> None:
        """The request's end, counted once (a later one is a no-op); the node's tokens
        held to what the request allows."""
        if tokens != (0, 0):
            tokens = bounded(tokens, self.spec.texts, self.spec.max_tokens)
        if not self.meter.record(outcome, *tokens):
            return
        streamed = str(self.stream).lower()
        self.state.metrics.invokes.labels(outcome, streamed, self.spec.endpoint).inc()
        if self.model is not None and outcome not in ("ok", "client_left"):
            self.measured.failed(self.model)

    async def _routes(self) -> list[Choice]:
        # The cache's routes when it has some (a stale one costs a try at most); its
        # empty answer is checked against the database before a 404 or a 503.
        name, endpoint = self.spec.model, self.spec.endpoint
        found = await self.state.gateway_cache.routes(name, endpoint)
        if not found:
            async with self.state.sessions() as session, session.begin():
                found = await deployment_routes.routes(session, name, endpoint)
                if not found and not await deployment_routes.anyone_serves(session, name, endpoint):
                    self.outcome(ErrorCode.MODEL_NOT_FOUND.value)
                    raise NotFound(
                        f"nothing serves {name!r} at {endpoint}",
                        code=ErrorCode.MODEL_NOT_FOUND,
                    )
        if self.spec.needs_tools and found and not any(route.tools for route in found):
            self.outcome(ErrorCode.TOOLS_UNSUPPORTED.value)
            raise FieldRefused(
                ErrorCode.TOOLS_UNSUPPORTED,
                "tools",
                f"no deployment of {name!r} can call tools (its chat template has none)",
            )
        choices = order(
            found,
            self.relay.in_flight,
            _rng,
            endpoint=endpoint,
            needs_tools=self.spec.needs_tools,
        )
        if not choices:
            self.outcome(ErrorCode.NO_READY_DEPLOYMENT.value)
            raise ServiceUnavailable(
                f"no deployment of {name!r} is ready now",
                code=ErrorCode.NO_READY_DEPLOYMENT,
                headers={"Retry-After": str(RETRY_NOT_READY_S)},
            )
        return choices[: self.settings.gateway_attempts]

    def cool_down(self, choice: Choice, reason: str) -> None:
        """Off the hot path: the row is written by a task of its own."""
        seconds = self.settings.gateway_cooldown_s
        if seconds <= 0:
            return

        async def write() -> None:
            try:
                async with self.state.sessions() as session, session.begin():
                    await deployments.cool_down(
                        session, choice.route.deployment_id, seconds, reason
                    )
            except Exception:  # a lost cooldown costs one more try, never the request
                logger.warning("could not record a cooldown", exc_info=True)

        self.relay.spawn(write())

    async def answer(self, request: Request) -> Response:
        gone = self.gone = asyncio.ensure_future(_disconnected(request))
        try:
            return await self._answer()
        finally:
            # A streamed answer's response watches the client from here on: its reads
            # of the connection must be the only ones.
            self.gone = None
            gone.cancel()
            if gone.done() and not gone.cancelled():
                gone.exception()  # retrieved: a receive that failed means it left too

    async def _answer(self) -> Response:
        choices = await self._routes()
        model = self.model = self.meter.model = choices[0].route.model
        self.measured.began(model)
        handed_over = False
        try:
            response = await self._relayed(choices)
            handed_over = isinstance(response, RelayedStream)
            return response
        finally:
            # A relayed stream ends its count when it closes (StreamEnding.close).
            if not handed_over:
                self.measured.ended(model)

    async def _relayed(self, choices: list[Choice]) -> Response:
        params = self.spec.params
        route = choices[0].route
        pending = self.relay.expect(self.invoke_id, route.node_id, route.deployment_id)
        busy = 0
        try:
            for choice in choices:
                outcome = await self._attempt(pending, choice, params)
                if isinstance(outcome, Response):
                    return outcome
                busy += outcome == "busy"
        except BaseException:
            self.relay.forget(pending)
            raise
        self.relay.forget(pending)
        if busy == len(choices):
            self.outcome(ErrorCode.DEPLOYMENT_BUSY.value)
            raise TooManyRequests(
                f"every deployment of {self.spec.model!r} is busy",
                code=ErrorCode.DEPLOYMENT_BUSY,
                headers={"Retry-After": "1"},
            )
        self.outcome(ErrorCode.NO_READY_DEPLOYMENT.value)
        raise ServiceUnavailable(
            f"no deployment of {self.spec.model!r} could take the request",
            code=ErrorCode.NO_READY_DEPLOYMENT,
            headers={"Retry-After": str(RETRY_NOT_READY_S)},
        )

    async def _attempt(
        self, pending: Pending, choice: Choice, params: InvokeBody
    ) -> Response | str:
        """One deployment: its answer, or why to try the next one."""
        route = choice.route
        if self.gone is not None and self.gone.done():
            return self._left(pending)  # before anything was sent to a node
        lease_id, epoch = pending.arm(route.node_id, route.deployment_id)
        invoke = Invoke(
            invoke_id=self.invoke_id,
            deployment_id=route.deployment_id,
            gateway=self.relay.id,
            lease=LeaseFence(lease_id=lease_id, epoch=epoch),
            params=params,
        )
        metrics = self.state.metrics
        self.relay.in_flight[route.deployment_id] += 1
        handed_over = False
        try:
            if not await self.relay.deliver(route.node_id, invoke):
                metrics.invoke_attempts.labels("unreachable").inc()
                self.cool_down(choice, "unreachable: no runtime channel took the invoke")
                return "unreachable"
            overhead_s = time.perf_counter() - self.arrived
            metrics.gateway_overhead.observe(overhead_s)
            first = await self.frame(pending, self._first_byte_s)
            if not isinstance(first, Opened):
                metrics.invoke_attempts.labels("timeout").inc()
                await self.relay.cancel(route.node_id, self.invoke_id)
                self.cool_down(choice, "first_token_timeout")
                return "timeout"
            if first.status != 200:
                refused, raw = await self._refusal(pending)
                if raw is None:
                    await self.relay.cancel(route.node_id, self.invoke_id)
                    raw = b""
                metrics.invoke_attempts.labels("refused").inc()
                if refused in RETRYABLE_REFUSALS:
                    # Busy passes; a stale endpoint list is no reason to keep the
                    # deployment's other endpoints from it.
                    if refused not in ("deployment_busy", "endpoint_not_served"):
                        self.cool_down(choice, refused)
                    return "busy" if refused == "deployment_busy" else "refused"
                self._passthrough(first, pending, raw)
            headers = self._receipts(choice, overhead_s)
            if self.stream:
                response = await self._streamed(pending, choice, first, headers)
            else:
                response = await self._plain(pending, choice, first, headers)
            if isinstance(response, Response):
                handed_over = isinstance(response, StreamingResponse)
                metrics.invoke_attempts.labels("answered").inc()
            return response
        except _ClientLeft:
            # Gone before its answer opened (or, plain, before it was whole): the node
            # stops now, not when the time-to-first-token bound would have given up.
            metrics.invoke_attempts.labels("client_left").inc()
            await self.relay.cancel(route.node_id, self.invoke_id)
            return self._left(pending)
        finally:
            if not handed_over:
                self.relay.in_flight[route.deployment_id] -= 1

    def _left(self, pending: Pending) -> Response:
        self.relay.forget(pending)
        self.outcome("client_left")
        return Response(status_code=499)

    async def frame(self, pending: Pending, timeout_s: float) -> object | None:
        """The attempt's next frame, None past `timeout_s`; _ClientLeft once the client
        has left, if that is watched (until the response is handed back)."""
        gone = self.gone
        if gone is None:
            with contextlib.suppress(TimeoutError):
                return await asyncio.wait_for(pending.frames.get(), timeout_s)
            return None
        if gone.done():
            raise _ClientLeft
        frame: asyncio.Future[Frame] = asyncio.ensure_future(pending.frames.get())
        waits: set[asyncio.Future[Any]] = {frame, gone}
        try:
            await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Cancelling a queue's get loses nothing: the item stays queued.
            frame.cancel()
        if frame.done() and not frame.cancelled():
            return frame.result()
        if gone.done():
            raise _ClientLeft
        return None

    async def _refusal(self, pending: Pending) -> tuple[str, bytes | None]:
        """The code of the node's refusal body (InvokeRefusal), read whole, and the body;
        ("", None) once it outgrew MAX_REFUSAL_BYTES (the rest is not read)."""
        parts: list[bytes] = []
        size = 0
        while True:
            frame = await self.frame(pending, self.settings.gateway_token_gap_timeout_s)
            if not isinstance(frame, bytes):
                break
            size += len(frame)
            if size > MAX_REFUSAL_BYTES:
                return "", None
            parts.append(frame)
        raw = b"".join(parts)
        try:
            # pydantic's parser, not json's: a nested refusal must not recurse (a node's
            # body is outside the trust boundary).
            return InvokeRefusal.model_validate_json(raw).code, raw
        except ValidationError:
            return "", raw

    def _receipts(self, choice: Choice, overhead_s: float) -> dict[str, str]:
        route = choice.route
        return {
            ROUTE_DEPLOYMENT_HEADER: str(route.deployment_id),
            ROUTE_NODE_HEADER: str(route.node_id),
            ROUTE_DEVICE_HEADER: route.device_id,
            ROUTE_REASON_HEADER: choice.reason,
            ROUTE_OVERHEAD_HEADER: f"{overhead_s * 1000:.2f}",
            # A browser takes the answer as its media type says, never as it looks.
            "X-Content-Type-Options": "nosniff",
        }

    @property
    def _first_byte_s(self) -> float:
        return self.settings.gateway_first_token_timeout_s * self.spec.answers_in_turn

    def _passthrough(self, opened: Opened, pending: Pending, raw: bytes) -> NoReturn:
        """llama-server refused the request itself (a 400 for what it cannot take):
        no other deployment would answer otherwise. A list of prompts refused at a later
        prompt was generated up to it: the worker's refusal carries that usage
        (agent/runtime/completion_list.py), metered as any (held to the request)."""
        self.relay.forget(pending)
        # By class: the node chooses the status, and the outcome is a metric label.
        self.outcome(f"upstream_{opened.status // 100}xx", plain_usage(raw))
        if opened.status >= 500:
            raise BadGateway(
                f"the model server failed on the request (HTTP {opened.status})",
                code=ErrorCode.UPSTREAM_FAILED,
            )
        raise Invalid(
            f"the model server refused the request (HTTP {opened.status})",
            code=ErrorCode.VALIDATION_FAILED,
        )

    async def _plain(
        self, pending: Pending, choice: Choice, opened: Opened, headers: dict[str, str]
    ) -> Response | str:
        """A plain answer is whole before its first byte goes out: any failure before
        then is retried elsewhere. A client that leaves meanwhile cancels it."""
        body, ended = await self._collect(pending)
        if body is None:
            # Any deployment would answer as much: refused, not retried.
            await self.relay.cancel(choice.route.node_id, self.invoke_id)
            self.relay.forget(pending)
            self.outcome(ErrorCode.UPSTREAM_TOO_LARGE.value)
            raise BadGateway(
                f"the answer is larger than {MAX_PLAIN_ANSWER_BYTES} bytes",
                code=ErrorCode.UPSTREAM_TOO_LARGE,
            )
        if ended is None or not ended.ok:
            await self.relay.cancel(choice.route.node_id, self.invoke_id)
            reason = ended.reason if ended else "token_gap_timeout"
            self.cool_down(choice, reason)
            self.state.metrics.invoke_attempts.labels("timeout" if ended is None else "lost").inc()
            return "lost"
        self.relay.forget(pending)
        self.outcome(OK, plain_usage(body))
        return Response(body, status_code=200, media_type=opened.content_type, headers=headers)

    async def _collect(self, pending: Pending) -> tuple[bytes | None, Ended | None]:
        """The answer whole and its end (None past the bound between frames); None for
        the answer once it outgrew MAX_PLAIN_ANSWER_BYTES."""
        parts: list[bytes] = []
        size = 0
        while True:
            frame = await self.frame(pending, self._first_byte_s)
            if isinstance(frame, bytes):
                size += len(frame)
                if size > MAX_PLAIN_ANSWER_BYTES:
                    return None, None
                parts.append(frame)
            elif isinstance(frame, Ended):
                return b"".join(parts), frame
            elif frame is None:
                return b"".join(parts), None

    async def _streamed(
        self, pending: Pending, choice: Choice, opened: Opened, headers: dict[str, str]
    ) -> Response | str:
        """The first chunk is waited for here (within the time-to-first-token bound),
        so a deployment that fails before it is retried elsewhere; after it, the
        stream is the client's, and a failure ends it with an error event."""
        first = await self.frame(pending, self.settings.gateway_first_token_timeout_s)
        if not isinstance(first, bytes):
            await self.relay.cancel(choice.route.node_id, self.invoke_id)
            reason = first.reason if isinstance(first, Ended) else "first_token_timeout"
            self.cool_down(choice, reason or "ended_before_first_token")
            self.state.metrics.invoke_attempts.labels("timeout").inc()
            return "lost"
        ttft_s = self.meter.ttft_s = time.perf_counter() - self.arrived
        if self.model is not None:
            self.measured.first_token(self.model, ttft_s)
        tally = StreamTally(strip_usage=self.spec.strip_usage)
        ending = StreamEnding(self, pending, choice, tally)
        gap_s = self.settings.gateway_token_gap_timeout_s
        return RelayedStream(
            relay_stream(self, pending, choice, first, ending, gap_s),
            ending.close,
            headers={**headers, "Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
