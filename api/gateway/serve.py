"""A service client's request at any gateway endpoint, once validated: its scope, its
day's budget (`max_tokens_per_day`, at every endpoint alike), its rate and concurrency
bounds, then the call (api/gateway/call.py); metered once per client, model and
outcome, whatever ends it (api/gateway/usage.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request
from fastapi.responses import Response

from api.errors import ApiError, BudgetExhausted, Forbidden, TooManyRequests
from api.gateway.call import Call, CallSpec, FieldRefused
from api.gateway.limits import LimitExceeded
from api.gateway.scope import ClientScope
from api.gateway.stream import RelayedStream
from api.gateway.usage import CLIENT_LEFT, InvokeMeter
from api.state import ApiState
from schemas.endpoints import Endpoint
from schemas.errors import ErrorCode
from store.errors import StoreError


async def _arrived() -> float:
    return time.perf_counter()


# Declared before authentication, so the overhead counts it too.
Arrived = Annotated[float, Depends(_arrived)]


def failure(exc: BaseException) -> str:
    """The outcome a request that raised is metered under: the code its client got."""
    if isinstance(exc, ApiError | StoreError):
        return exc.code.value
    if isinstance(exc, asyncio.CancelledError):
        return CLIENT_LEFT
    return ErrorCode.INTERNAL_ERROR.value


async def serve(
    arrived: float,
    scope: ClientScope,
    request: Request,
    state: ApiState,
    model: str,
    spec: Callable[[], CallSpec],
    *,
    endpoint: Endpoint,
    stream: bool,
) -> Response:
    """One request of a service client at any endpoint: its scope, its day's budget, its
    bounds, then the call; metered once whatever ends it."""
    meter = state.usage.meter(scope, model)
    try:
        return await _serve(arrived, scope, request, state, model, spec, meter, endpoint, stream)
    except BaseException as exc:
        # Whatever raised, unless the call metered it first (its own outcome).
        meter.record(failure(exc))
        raise


async def _serve(
    arrived: float,
    scope: ClientScope,
    request: Request,
    state: ApiState,
    model: str,
    spec: Callable[[], CallSpec],
    meter: InvokeMeter,
    endpoint: Endpoint,
    stream: bool,
) -> Response:
    if not scope.allows(model):
        raise Forbidden(f"this client may not call {model!r}", code=ErrorCode.MODEL_NOT_ALLOWED)
    streamed = str(stream).lower()
    if scope.max_tokens_per_day is not None:
        # Before the bounds: a refused request spends no rate token.
        retry_after_s = await state.usage.budget_retry_after(scope)
        if retry_after_s is not None:
            state.metrics.invokes.labels(ErrorCode.BUDGET_EXHAUSTED.value, streamed, endpoint).inc()
            raise BudgetExhausted(
                "this client's tokens for today are spent (max_tokens_per_day)",
                headers={"Retry-After": str(retry_after_s)},
            )
    try:
        admission = state.client_limits.admit(scope)
    except LimitExceeded as exc:
        state.metrics.invokes.labels(exc.code, streamed, endpoint).inc()
        raise TooManyRequests(
            f"past this client's bound ({exc.code})",
            code=ErrorCode(exc.code),
            headers={"Retry-After": str(exc.retry_after_s)},
        ) from None
    try:
        call = Call(state, spec(), arrived, meter)
        response = await call.answer(request)
    except FieldRefused as exc:
        admission.release()
        return exc.response(request.url.path)
    except BaseException:
        admission.release()
        raise
    if isinstance(response, RelayedStream):
        # Released when the stream ends (the response owns it from now on).
        response.on_finish(admission.release)
    else:
        admission.release()
    return response
