"""The fleet's two most frequent requests, answered without FastAPI's per-request work.

A fleet sends a heartbeat every 10 s and a telemetry sample every 20 s per node; at
thousands of nodes, FastAPI's dependency solving, body validation and response
serialisation cost the API process several times what the heartbeat itself does
(ops/bench/README.md: the fleet profile). So these two have raw ASGI routes ahead of
their documented ones, for the common case only:

* a heartbeat from a node in the node cache that is routine (api/agent/heartbeat.py):
  noted in the group-commit buffer and answered;
* a telemetry sample from a node in the node cache: the same rules as the documented
  route (api/agent/ingest.py), group-committed with the other cached nodes' samples
  (api/telemetry_batch.py).

Everything else (no cached node, a body that does not parse or validate, a heartbeat
that brings news) is handed to the documented route with the body already read, so
its errors, its 422s and its transactional path stay where they are. Errors raised
here (a replay, another node's id) go through the same exception handlers as every
route's (api/handlers.py): this is a route, inside the application's middleware.
"""

from __future__ import annotations

import json
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from starlette.routing import Match, Route
from starlette.types import Message, Receive, Scope, Send

from api.agent.auth import admit_cached, presented_credential
from api.agent.heartbeat import answer_routine, routine
from api.deps import cached_node
from api.metrics import counted_ingest
from api.state import ApiState
from schemas.agent import HeartbeatRequest, TelemetryReport
from schemas.protocol import HEARTBEAT, TELEMETRY, StreamName

_JSON_HEADERS = [(b"content-type", b"application/json")]
M = TypeVar("M", bound=BaseModel)


async def _body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            # The client left before its body arrived: nothing to answer.
            raise _Gone()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


class _Gone(Exception):
    pass


def _replaying(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the documented route the body this one already read."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _header(scope: Scope, wanted: bytes) -> str | None:
    for name, value in scope["headers"]:
        if name == wanted:
            return str(value.decode("latin-1"))
    return None


def _parsed(model: type[M], scope: Scope, body: bytes) -> M | None:
    """The body as the documented route would read it (a JSON body, json.loads, then
    validation in Python mode, as FastAPI does), or None to leave it to that route."""
    content_type = _header(scope, b"content-type")
    if content_type is not None and content_type.split(";")[0].strip() != "application/json":
        return None
    try:
        return model.model_validate(json.loads(body))
    except (ValueError, ValidationError, RecursionError):
        return None


async def _answer(send: Send, model: BaseModel) -> None:
    content = model.model_dump_json().encode()
    headers = [*_JSON_HEADERS, (b"content-length", str(len(content)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": content})


# Set on a request this path declined: the router then passes over its raw route.
_DECLINED = "modelforge.fast_path_declined"


class _Endpoint:
    """The ASGI endpoint of one raw route: answers the common case, or routes the request
    again, past itself, to the documented route."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state: ApiState = scope["app"].state.modelforge
        try:
            body = await _body(receive)
        except _Gone:
            return
        route = scope["route"].path
        if await self.answered(state, scope, body, send):
            state.metrics.fast_path.labels(route, "answered").inc()
            return
        state.metrics.fast_path.labels(route, "declined").inc()
        scope[_DECLINED] = True
        await scope["router"](scope, _replaying(body, receive), send)

    async def answered(self, state: ApiState, scope: Scope, body: bytes, send: Send) -> bool:
        raise NotImplementedError


class _FastRoute(Route):
    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope.get(_DECLINED):
            return Match.NONE, {}
        match, child = super().matches(scope)
        # The access log labels requests by the matched route's template.
        return match, {**child, "route": self}


class _Heartbeat(_Endpoint):
    async def answered(self, state: ApiState, scope: Scope, body: bytes, send: Send) -> bool:
        cached = cached_node(state, presented_credential(_header(scope, b"authorization")))
        if cached is None:
            return False
        request = _parsed(HeartbeatRequest, scope, body)
        if request is None or not routine(cached, request):
            return False
        await _answer(send, answer_routine(state, cached))
        return True


class _Telemetry(_Endpoint):
    async def answered(self, state: ApiState, scope: Scope, body: bytes, send: Send) -> bool:
        cached = cached_node(state, presented_credential(_header(scope, b"authorization")))
        if cached is None:
            return False
        report = _parsed(TelemetryReport, scope, body)
        if report is None:
            return False
        admit_cached(cached, state.heartbeats.database_now()).require_owns(report.node_id)
        with counted_ingest(state.metrics, StreamName.TELEMETRY) as count:
            # Group-committed with the other cached nodes' samples (api/telemetry_batch.py).
            result = count(await state.telemetry.ingest(cached.node_id, report))
        await _answer(send, result)
        return True


def fast_routes() -> list[Route]:
    """Raw routes for POST HEARTBEAT and PUT TELEMETRY, to go ahead of the documented
    ones (which stay in the OpenAPI document and answer everything else)."""
    return [
        _FastRoute(HEARTBEAT, _Heartbeat(), methods=["POST"], include_in_schema=False),
        _FastRoute(TELEMETRY, _Telemetry(), methods=["PUT"], include_in_schema=False),
    ]
