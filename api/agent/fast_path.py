"""The fleet's two most frequent requests, answered ahead of the application.

A fleet sends a heartbeat every 10 s and a telemetry sample every 20 s per node. At
thousands of nodes, FastAPI's per-request work (dependency solving, body validation,
response serialisation) cost several times what a heartbeat itself does, and the
middleware stack in front of every route (ours, Starlette's error and exception layers,
FastAPI's exit stack, the router's matching) a third of what was left
(ops/bench/README.md: the fleet profile). So `FleetApp`, the application itself, looks
at method and path before any of that; for these two routes it does here what the
middleware would do (the correlation id, the body bound, the access record) and
answers the common case only:

* a heartbeat from a node in the node cache that is routine (api/agent/heartbeat.py):
  noted in the group-commit buffer and answered;
* a telemetry sample from a node in the node cache: the same rules as the documented
  route (store/ingest.py), group-committed with the other cached nodes' samples
  (api/telemetry_batch.py).

Everything else (no cached node, no or a too large Content-Length, a body that does not
parse or validate, a heartbeat that brings news) and every error (a replay, another
node's id, the database down) is handed to the whole application with the body already
read and the correlation id already chosen, so the documented route decides it: its
errors, its 422s and its transactional path stay in one place (api/handlers.py). A
refused telemetry sample was not written, so deciding it again changes nothing.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import FastAPI
from pydantic import BaseModel, ValidationError
from starlette.types import Message, Receive, Scope, Send

from api.agent.auth import admit_cached, presented_credential
from api.agent.heartbeat import answer_routine, routine
from api.deps import cached_node
from api.metrics import ApiMetrics, count_decision
from api.middleware.access_log import record_access
from api.middleware.correlation import HEADER_BYTES, incoming_correlation_id
from api.middleware.utf8_body import BodyNotUtf8, decoded
from api.state import ApiState
from schemas.agent import HeartbeatRequest, TelemetryReport
from schemas.protocol import HEARTBEAT, TELEMETRY, StreamName
from store.correlation import correlation_id_var

_JSON = (b"content-type", b"application/json")
M = TypeVar("M", bound=BaseModel)
Full = Callable[[Scope, Receive, Send], Awaitable[None]]


class _Gone(Exception):
    pass


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


def _replaying(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the application the body this path already read."""
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


def _content_length(scope: Scope) -> int | None:
    declared = _header(scope, b"content-length")
    if declared is None or not declared.isdigit():
        return None
    return int(declared)


def _parsed(model: type[M], scope: Scope, body: bytes) -> M | None:
    """The body as the documented route would read it (a JSON body, UTF-8 only as the
    middleware has it, json.loads, then validation in Python mode, as FastAPI does), or
    None to leave it to that route."""
    content_type = _header(scope, b"content-type")
    if content_type is not None and content_type.split(";")[0].strip() != "application/json":
        return None
    try:
        return model.model_validate(json.loads(decoded(body)))
    except (BodyNotUtf8, ValueError, ValidationError, RecursionError):
        return None


class FleetEndpoint:
    """One fleet route ahead of the application: the common case answered here, the
    rest handed to the whole application."""

    def __init__(self, route: str, method: str, metrics: ApiMetrics, max_body_bytes: int) -> None:
        self.route = route
        self.method = method
        self.max_body_bytes = max_body_bytes
        # Resolved once: a labelled child per request is a dictionary lookup under a lock.
        self._answered = metrics.fast_path.labels(route, "answered")
        self._declined = metrics.fast_path.labels(route, "declined")
        self._requests = metrics.requests.labels(route, method, "200")
        self._latency = metrics.latency.labels(route, method)

    async def __call__(
        self, app: FastAPI, scope: Scope, receive: Receive, send: Send, full: Full
    ) -> None:
        started = time.perf_counter()
        declared = _content_length(scope)
        if declared is None or declared > self.max_body_bytes:
            # Chunked, or too large: the body-limit middleware's to count or refuse.
            self._declined.inc()
            await full(scope, receive, send)
            return
        try:
            body = await _body(receive)
        except _Gone:
            return
        correlation_id = incoming_correlation_id(scope) or secrets.token_hex(16)
        token = correlation_id_var.set(correlation_id)
        try:
            answer = await self.answer(app.state.modelforge, scope, body)
        except Exception:  # decided again, and answered, by the documented route
            answer = None
        finally:
            correlation_id_var.reset(token)
        if answer is None:
            self._declined.inc()
            # The same correlation id as this attempt's: the middleware echoes it.
            headers = [*scope["headers"], (HEADER_BYTES, correlation_id.encode())]
            await full({**scope, "headers": headers}, _replaying(body, receive), send)
            return
        content = answer.model_dump_json().encode()
        headers = [
            _JSON,
            (b"content-length", str(len(content)).encode()),
            (HEADER_BYTES, correlation_id.encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": content})
        self._answered.inc()
        elapsed = time.perf_counter() - started
        self._requests.inc()
        self._latency.observe(elapsed)
        record_access(self.method, scope["path"], 200, elapsed)

    async def answer(self, state: ApiState, scope: Scope, body: bytes) -> BaseModel | None:
        raise NotImplementedError


class _Heartbeat(FleetEndpoint):
    async def answer(self, state: ApiState, scope: Scope, body: bytes) -> BaseModel | None:
        cached = cached_node(state, presented_credential(_header(scope, b"authorization")))
        if cached is None:
            return None
        request = _parsed(HeartbeatRequest, scope, body)
        if request is None or not routine(cached, request):
            return None
        return answer_routine(state, cached)


class _Telemetry(FleetEndpoint):
    async def answer(self, state: ApiState, scope: Scope, body: bytes) -> BaseModel | None:
        cached = cached_node(state, presented_credential(_header(scope, b"authorization")))
        if cached is None:
            return None
        report = _parsed(TelemetryReport, scope, body)
        if report is None:
            return None
        admit_cached(cached, state.heartbeats.database_now()).require_owns(report.node_id)
        # Group-committed with the other cached nodes' samples (api/telemetry_batch.py).
        # Counted only when answered here: a refusal is counted by the documented route.
        result = await state.telemetry.ingest(cached.node_id, report)
        count_decision(state.metrics, StreamName.TELEMETRY, result)
        return result


class FleetApp(FastAPI):
    """The FastAPI application, with the fleet's two routes looked at before its
    middleware stack. The documented routes stay in the OpenAPI document and answer
    everything these do not."""

    def __init__(self, *, metrics: ApiMetrics, max_body_bytes: int, **options: Any) -> None:
        super().__init__(**options)
        self.fleet_routes: dict[tuple[str, str], FleetEndpoint] = {
            ("POST", HEARTBEAT): _Heartbeat(HEARTBEAT, "POST", metrics, max_body_bytes),
            ("PUT", TELEMETRY): _Telemetry(TELEMETRY, "PUT", metrics, max_body_bytes),
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            endpoint = self.fleet_routes.get((scope["method"], scope["path"]))
            if endpoint is not None:
                await endpoint(self, scope, receive, send, super().__call__)
                return
        await super().__call__(scope, receive, send)
