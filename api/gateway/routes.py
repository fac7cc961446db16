"""`GET /v1/models` and `POST /v1/chat/completions` for service clients.

A chat completion becomes a deployment.invoke.v1: typed, bounded parameters only
(schemas/gateway.py), for a ready deployment the client's scope allows, chosen by
api/gateway/routing.py, delivered with its lease on the node's runtime channel and
answered over the node's answer stream (api/gateway/relay.py). Per request:

* **Before the first byte** reaches the client, a deployment that cannot take the
  invoke (no channel, busy, draining, not loaded), or that passes the time-to-first-
  token bound, is left for the next one (up to `gateway_attempts`); one that failed or
  timed out cools down for `gateway_cooldown_s` (written off the hot path, shown in
  the admin API). After the first byte, a failure ends the stream with a terminal SSE
  error event (a plain answer has no first byte until it is whole).
* The time to first token and the gap between tokens are separate bounds.
* 404 only for a model or role no deployment serves; 503 with Retry-After when none is
  ready; 429 with Retry-After past the client's bounds or when every deployment is busy.
* A client that disconnects cancels its invoke at once (the node closes llama-server's
  connection, which frees the device), whenever it leaves: while the gateway waits for
  the answer to open (ASGI's http.disconnect, watched from the delivery on), or once
  the stream is the client's (the response sees its send fail).
* Every answer carries route receipts: deployment, node, device, why it was chosen,
  and the gateway's own overhead (arrival to delivery) in ms.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any, NoReturn

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from api.deps import State
from api.errors import Forbidden, NotFound, ServiceUnavailable, TooManyRequests
from api.gateway.auth import ServiceClientAuth
from api.gateway.limits import LimitExceeded
from api.gateway.relay import Ended, Frame, Opened, Pending
from api.gateway.routing import Choice, order
from api.gateway.scope import ClientScope
from api.handlers import gateway_error
from api.state import ApiState
from schemas.errors import ErrorBody, ErrorCode
from schemas.gateway import (
    RETRYABLE_REFUSALS,
    ChatCompletionRequest,
    GatewayErrorBody,
    Invoke,
    InvokeParams,
    InvokeRefusal,
    ModelEntry,
    ModelListing,
)
from schemas.jobs import LeaseFence
from schemas.protocol import (
    GATEWAY_CHAT_COMPLETIONS,
    GATEWAY_MODELS,
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

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": GatewayErrorBody} for status in (401, 403, 404, 422, 429, 503)
}
router = APIRouter(tags=["gateway"], responses=_ERRORS)
RETRY_NOT_READY_S = 5
_rng = random.SystemRandom()


async def _arrived() -> float:
    return time.perf_counter()


# Declared before authentication, so the overhead counts it too.
Arrived = Annotated[float, Depends(_arrived)]


@router.get(GATEWAY_MODELS)
async def list_models(arrived: Arrived, scope: ServiceClientAuth, state: State) -> ModelListing:
    """The served models and roles this client may call that some deployment serves."""
    async with state.sessions() as session, session.begin():
        served = await deployment_routes.served(session)
    models: dict[str, set[str]] = {}
    roles: set[str] = set()
    for model, model_roles in served:
        if model in scope.models:
            models.setdefault(model, set()).update(model_roles)
        roles.update(role for role in model_roles if role in scope.roles)
    data = [ModelEntry(id=m, roles=sorted(r)) for m, r in sorted(models.items())]
    data += [ModelEntry(id=role, kind="role") for role in sorted(roles - models.keys())]
    return ModelListing(data=data)


def _params(body: ChatCompletionRequest, state: ApiState) -> InvokeParams:
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    return InvokeParams(
        messages=body.messages,
        max_tokens=body.max_tokens
        or body.max_completion_tokens
        or state.settings.gateway_default_max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        stop=stop,
        stream=body.stream,
        include_usage=bool(body.stream_options and body.stream_options.include_usage),
    )


@router.post(GATEWAY_CHAT_COMPLETIONS, response_model=None)
async def chat_completions(
    arrived: Arrived,
    scope: ServiceClientAuth,
    body: ChatCompletionRequest,
    request: Request,
    state: State,
) -> Response:
    """OpenAI's chat completion, plain or streamed (`stream: true`, server-sent events)."""
    if not scope.allows(body.model):
        raise Forbidden(
            f"this client may not call {body.model!r}", code=ErrorCode.MODEL_NOT_ALLOWED
        )
    try:
        admission = state.client_limits.admit(scope)
    except LimitExceeded as exc:
        state.metrics.invokes.labels(exc.code, str(body.stream).lower()).inc()
        raise TooManyRequests(
            f"past this client's bound ({exc.code})",
            code=ErrorCode(exc.code),
            headers={"Retry-After": str(exc.retry_after_s)},
        ) from None
    call = _Call(state, scope, body, arrived)
    try:
        response = await call.answer(request)
    except BaseException:
        admission.release()
        raise
    if isinstance(response, _RelayedStream):
        # Released when the stream ends (the response owns it from now on).
        response.on_finish(admission.release)
    else:
        admission.release()
    return response


class _RelayedStream(StreamingResponse):
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


class _ClientLeft(Exception):
    """The client closed its connection before its answer was handed to it."""


class _Call:
    def __init__(
        self, state: ApiState, scope: ClientScope, body: ChatCompletionRequest, arrived: float
    ) -> None:
        self.state = state
        self.scope = scope
        self.body = body
        self.arrived = arrived
        self.relay = state.invokes
        self.settings = state.settings
        self.stream = body.stream
        self.invoke_id = uuid.uuid4()
        # The served model the invoke went to (its first route's), once routes are known:
        # what its measurements count under (api/gateway/measurements.py).
        self.model: str | None = None
        self.measured = state.measurements
        # Done once the client has left (http.disconnect); watched by every wait before
        # the response is handed back.
        self.gone: asyncio.Future[None] | None = None

    def _outcome(self, outcome: str) -> None:
        self.state.metrics.invokes.labels(outcome, str(self.stream).lower()).inc()
        if self.model is not None and outcome not in ("ok", "client_left"):
            self.measured.failed(self.model)

    async def _routes(self) -> list[Choice]:
        # The cache's routes when it has some (a stale one costs a try at most); its
        # empty answer is checked against the database before a 404 or a 503.
        found = await self.state.gateway_cache.routes(self.body.model)
        if not found:
            async with self.state.sessions() as session, session.begin():
                name = self.body.model
                found = await deployment_routes.routes(session, name)
                if not found and not await deployment_routes.anyone_serves(session, name):
                    self._outcome(ErrorCode.MODEL_NOT_FOUND.value)
                    raise NotFound(
                        f"no deployment serves {self.body.model!r}",
                        code=ErrorCode.MODEL_NOT_FOUND,
                    )
        choices = order(found, self.relay.in_flight, _rng)
        if not choices:
            self._outcome(ErrorCode.NO_READY_DEPLOYMENT.value)
            raise ServiceUnavailable(
                f"no deployment of {self.body.model!r} is ready now",
                code=ErrorCode.NO_READY_DEPLOYMENT,
                headers={"Retry-After": str(RETRY_NOT_READY_S)},
            )
        return choices[: self.settings.gateway_attempts]

    def _cool_down(self, choice: Choice, reason: str) -> None:
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
        model = self.model = choices[0].route.model
        self.measured.began(model)
        handed_over = False
        try:
            response = await self._relayed(choices)
            handed_over = isinstance(response, _RelayedStream)
            return response
        finally:
            # A relayed stream ends its count when it closes (_Ending.close).
            if not handed_over:
                self.measured.ended(model)

    async def _relayed(self, choices: list[Choice]) -> Response:
        params = _params(self.body, self.state)
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
            self._outcome(ErrorCode.DEPLOYMENT_BUSY.value)
            raise TooManyRequests(
                f"every deployment of {self.body.model!r} is busy",
                code=ErrorCode.DEPLOYMENT_BUSY,
                headers={"Retry-After": "1"},
            )
        self._outcome(ErrorCode.NO_READY_DEPLOYMENT.value)
        raise ServiceUnavailable(
            f"no deployment of {self.body.model!r} could take the request",
            code=ErrorCode.NO_READY_DEPLOYMENT,
            headers={"Retry-After": str(RETRY_NOT_READY_S)},
        )

    async def _attempt(
        self, pending: Pending, choice: Choice, params: InvokeParams
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
                self._cool_down(choice, "unreachable: no runtime channel took the invoke")
                return "unreachable"
            overhead_s = time.perf_counter() - self.arrived
            metrics.gateway_overhead.observe(overhead_s)
            first = await self._frame(pending, self.settings.gateway_first_token_timeout_s)
            if not isinstance(first, Opened):
                metrics.invoke_attempts.labels("timeout").inc()
                await self.relay.cancel(route.node_id, self.invoke_id)
                self._cool_down(choice, "first_token_timeout")
                return "timeout"
            if first.status != 200:
                refused = await self._refusal(pending)
                metrics.invoke_attempts.labels("refused").inc()
                if refused in RETRYABLE_REFUSALS:
                    if refused != "deployment_busy":
                        self._cool_down(choice, refused)
                    return "busy" if refused == "deployment_busy" else "refused"
                self._passthrough(first, pending)
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
        self._outcome("client_left")
        return Response(status_code=499)

    async def _frame(self, pending: Pending, timeout_s: float) -> object | None:
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

    async def _refusal(self, pending: Pending) -> str:
        """The code of the node's refusal body (InvokeRefusal), read whole."""
        raw = b""
        while True:
            frame = await self._frame(pending, self.settings.gateway_token_gap_timeout_s)
            if isinstance(frame, bytes):
                raw += frame
                continue
            break
        try:
            # pydantic's parser, not json's: a nested refusal must not recurse (a node's
            # body is outside the trust boundary).
            return InvokeRefusal.model_validate_json(raw).code
        except ValidationError:
            return ""

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

    def _passthrough(self, opened: Opened, pending: Pending) -> NoReturn:
        """llama-server refused the request itself (a 400 for what it cannot take):
        no other deployment would answer otherwise."""
        self.relay.forget(pending)
        self._outcome(f"upstream_{opened.status}")
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
        if ended is None or not ended.ok:
            await self.relay.cancel(choice.route.node_id, self.invoke_id)
            reason = ended.reason if ended else "token_gap_timeout"
            self._cool_down(choice, reason)
            self.state.metrics.invoke_attempts.labels("timeout" if ended is None else "lost").inc()
            return "lost"
        self.relay.forget(pending)
        self._outcome("ok")
        return Response(body, status_code=200, media_type=opened.content_type, headers=headers)

    async def _collect(self, pending: Pending) -> tuple[bytes, Ended | None]:
        parts: list[bytes] = []
        while True:
            frame = await self._frame(pending, self.settings.gateway_first_token_timeout_s)
            if isinstance(frame, bytes):
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
        first = await self._frame(pending, self.settings.gateway_first_token_timeout_s)
        if not isinstance(first, bytes):
            await self.relay.cancel(choice.route.node_id, self.invoke_id)
            reason = first.reason if isinstance(first, Ended) else "first_token_timeout"
            self._cool_down(choice, reason or "ended_before_first_token")
            self.state.metrics.invoke_attempts.labels("timeout").inc()
            return "lost"
        if self.model is not None:
            self.measured.first_token(self.model, time.perf_counter() - self.arrived)
        ending = _Ending(self, pending, choice)
        return _RelayedStream(
            self._relay_stream(pending, choice, first, ending),
            ending.close,
            headers={**headers, "Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def _relay_stream(
        self, pending: Pending, choice: Choice, first: bytes, ending: _Ending
    ) -> AsyncIterator[bytes]:
        yield first
        while True:
            frame = await self._frame(pending, self.settings.gateway_token_gap_timeout_s)
            if isinstance(frame, bytes):
                yield frame
                continue
            if isinstance(frame, Ended) and frame.ok:
                ending.finished = True
                self._outcome("ok")
                return
            code = ErrorCode.TOKEN_GAP_TIMEOUT if frame is None else ErrorCode.NODE_LOST
            self._cool_down(choice, code.value)
            self._outcome(code.value)
            yield _stream_error(code, "the deployment stopped answering mid-stream")
            return


class _Ending:
    """What a relayed stream leaves behind, undone once however the stream ends."""

    def __init__(self, call: _Call, pending: Pending, choice: Choice) -> None:
        self.call = call
        self.pending = pending
        self.route = choice.route
        self.finished = False
        self._closed = False

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        relay = self.call.relay
        try:
            if not self.finished:
                # The client left (or never read): stop the node's work at once.
                await relay.cancel(self.route.node_id, self.call.invoke_id)
        finally:
            relay.forget(self.pending)
            relay.in_flight[self.route.deployment_id] -= 1
            if self.call.model is not None:
                self.call.measured.ended(self.call.model)


def _stream_error(code: ErrorCode, message: str) -> bytes:
    """A stream's terminal error event: the envelope of every /v1 refusal."""
    body = ErrorBody(code=code, message=message, correlation_id=current_correlation_id() or "")
    return f"data: {gateway_error(502, body).model_dump_json()}\n\n".encode()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
