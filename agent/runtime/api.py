"""The runtime worker's local OpenAI-compatible endpoints, in front of the device slots.

Plain Starlette routes (no schema layer on this path): the body is passed through to
llama-server as it came, with only `model` checked and rewritten to the served name, and
a `max_tokens` added when it has none (`default_max_tokens`).
Errors use OpenAI's shape, `{"error": {"message", "type", "code"}}`:
* unknown model → 404 `model_not_found`; a body that is not a JSON object, or that
  nests deeper than MAX_BODY_DEPTH → 400; a body over MAX_BODY_BYTES → 413;
  `max_tokens` above `max_tokens_ceiling` → 400 `max_tokens_too_large`;
* the device's bound reached → 429 with Retry-After;
* the device serves a deployment (pinned to its model, agent/runtime/devices.py) →
  503 `device_pinned` with Retry-After;
* a server that is not ready within its startup timeout, or that died → 503 with
  Retry-After (never an upstream "Loading model" passed through); the worker stopping
  → 503 `stopping`.
A streamed answer (`"stream": true`) is relayed chunk by chunk; the device stays held
until its last chunk, so a model switch waits for it. A client that disconnects, streamed
or not, frees the device at once: its request on llama-server is cancelled (the
connection to llama-server closed), or its wait in the device's line given up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import aiohttp
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from agent.runtime.config import ModelSpec, RuntimeConfig
from agent.runtime.devices import Busy, Pinned
from agent.runtime.server import ServerFailed
from agent.runtime.worker import RuntimeWorker
from schemas.bounded import Unreadable, depth, read_capped
from schemas.runtime_local import (
    LOCAL_CHAT_COMPLETIONS,
    LOCAL_HEALTH,
    LOCAL_INVENTORY,
    LOCAL_MODELS,
    LOCAL_REGISTRATION,
)

logger = logging.getLogger("modelforge.runtime.api")

RETRY_BUSY_S = 1
RETRY_NOT_READY_S = 5
# A chat request, however long its conversation, is far below this; a local client that
# sends more is refused before it holds the worker's memory.
MAX_BODY_BYTES = 16 * 1024 * 1024
# Python's json parser recurses: a request nested past this is refused before it parses.
MAX_BODY_DEPTH = 64
# Upstream headers worth relaying (hop-by-hop and length are the server's own business).
_RELAYED = ("content-type", "cache-control")


def openai_error(
    status: int, message: str, code: str, *, retry_after_s: int | None = None
) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 and status != 429 else "server_error"
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    body = {"error": {"message": message, "type": kind, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


# What a stream's client reads when llama-server fails or is stopped mid-answer: an
# error event in OpenAI's shape, then the end, rather than a stream that just stops.
STREAM_FAILED = (
    b'data: {"error": {"message": "llama-server stopped mid-answer", '
    b'"type": "server_error", "code": "upstream_unavailable"}}\n\n'
)


# Every key llama-server reads a request's token bound from (n_predict before the rest).
_MAX_TOKENS_KEYS = frozenset({"max_tokens", "max_completion_tokens", "n_predict"})


STREAM_DONE = b"data: [DONE]"
# What a relayed request raises when llama-server or the connection to it goes away (a
# closed session's read raises a bare TimeoutError, an OSError).
RELAY_ERRORS = (aiohttp.ClientError, OSError)


def bound_max_tokens(body: dict[str, Any], config: RuntimeConfig) -> str | None:
    """Give the request a bound (the configured default) when it has none; a refusal
    when it asks for more than the ceiling or for no bound at all (-1)."""
    asked = [body[key] for key in _MAX_TOKENS_KEYS if key in body]
    if not asked:
        body["max_tokens"] = config.default_max_tokens
        return None
    ceiling = config.max_tokens_ceiling
    for value in asked:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= ceiling:
            return f"max_tokens must be an integer from 1 to {ceiling} on this node"
    return None


async def until_disconnected(request: Request, work: Awaitable[Response]) -> Response:
    """`work`'s response, or its cancellation as soon as the client disconnects (the
    body has been read, so the only message left to receive is the disconnect)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(task, gone, return_exceptions=True)
    if task.cancelled():
        logger.info("a client left before its answer; its request was cancelled")
        return Response(status_code=499)  # nobody reads it
    return task.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def create_app(worker: RuntimeWorker, *, node_id: str, base_url: str) -> Starlette:
    async def models(request: Request) -> Response:
        data = [
            {"id": m.model_id, "object": "model", "owned_by": "modelforge", "roles": m.roles}
            for m in worker.served_models()
        ]
        return JSONResponse({"object": "list", "data": data})

    async def inventory(request: Request) -> Response:
        return JSONResponse(worker.inventory().model_dump(mode="json"))

    async def registration(request: Request) -> Response:
        return JSONResponse(worker.registration(node_id, base_url).model_dump(mode="json"))

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def chat_completions(request: Request) -> Response:
        if worker.stopping.is_set():
            return openai_error(
                503, "the runtime worker is stopping", "stopping", retry_after_s=RETRY_BUSY_S
            )
        try:
            raw = await read_capped(
                request.stream(), MAX_BODY_BYTES, declared=request.headers.get("content-length")
            )
        except Unreadable as exc:
            return openai_error(413, exc.reason, "body_too_large")
        if depth(raw) > MAX_BODY_DEPTH:
            return openai_error(400, f"the body nests deeper than {MAX_BODY_DEPTH}", "invalid_json")
        try:
            body: Any = json.loads(raw)
        except ValueError:
            return openai_error(400, "the body is not valid JSON", "invalid_json")
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return openai_error(
                400, "a JSON object with a string `model` is required", "invalid_body"
            )
        model = worker.model(body["model"])
        if model is None:
            return openai_error(
                404, f"model {body['model']!r} is not served here", "model_not_found"
            )
        unbounded = not _MAX_TOKENS_KEYS & body.keys()
        refusal = bound_max_tokens(body, worker.config)
        if refusal is not None:
            return openai_error(400, refusal, "max_tokens_too_large")
        # Re-serialised only when it changed: that costs the hot path.
        if body["model"] != model.served_name or unbounded:
            body["model"] = model.served_name
            raw = json.dumps(body).encode()
        # Until the answer (or the stream's start) is under way, a client that leaves
        # gives up its place: its wait for the device, or its request on llama-server,
        # is cancelled at once. A stream's relay is cancelled by Starlette itself.
        return await until_disconnected(request, answer(model, raw, bool(body.get("stream"))))

    async def answer(model: ModelSpec, raw: bytes, stream: bool) -> Response:
        slot = worker.slot_for(model)
        held = contextlib.AsyncExitStack()
        try:
            server = await held.enter_async_context(slot.serving(model))
        except Busy as exc:
            return openai_error(429, str(exc), "device_busy", retry_after_s=RETRY_BUSY_S)
        except Pinned as exc:
            return openai_error(503, exc.detail, "device_pinned", retry_after_s=RETRY_NOT_READY_S)
        except ServerFailed as exc:
            logger.warning("%s on %s: %s (%s)", model.model_id, slot.device.id, exc.code, exc)
            return openai_error(503, exc.detail, exc.code, retry_after_s=RETRY_NOT_READY_S)
        except BaseException:
            await held.aclose()
            raise
        try:
            upstream = await server.post_relayed(LOCAL_CHAT_COMPLETIONS, raw)
        except RELAY_ERRORS as exc:
            await held.aclose()
            detail = f"llama-server did not answer ({type(exc).__name__})"
            return openai_error(503, detail, "upstream_unavailable", retry_after_s=RETRY_BUSY_S)
        except BaseException:
            await held.aclose()
            raise
        headers = {k: v for k, v in upstream.headers.items() if k.lower() in _RELAYED}
        if not stream:
            try:
                content = await upstream.read()
            except RELAY_ERRORS:
                return openai_error(
                    503, "llama-server failed mid-answer", "upstream_unavailable", retry_after_s=1
                )
            finally:
                # Closed, not released, when the body did not arrive whole (a client
                # that left): the connection's end is what stops llama-server's work.
                upstream.close()
                await held.aclose()
            return Response(content, status_code=upstream.status, headers=headers)

        # An event stream that ends without llama-server's `[DONE]` was cut (the server
        # died or was stopped; a closed connection may read as a plain end).
        events = upstream.status == 200 and upstream.content_type == "text/event-stream"

        async def relay() -> AsyncIterator[bytes]:
            try:
                tail = b""
                try:
                    async for chunk in upstream.content.iter_any():
                        tail = (tail + chunk)[-64:]
                        yield chunk
                    cut = events and STREAM_DONE not in tail
                except RELAY_ERRORS:
                    cut = True
                if cut:
                    logger.warning("%s: llama-server failed mid-stream", slot.device.id)
                    yield STREAM_FAILED
            finally:
                upstream.close()
                await held.aclose()

        return StreamingResponse(relay(), status_code=upstream.status, headers=headers)

    routes = [
        Route(LOCAL_MODELS, models, methods=["GET"]),
        Route(LOCAL_CHAT_COMPLETIONS, chat_completions, methods=["POST"]),
        Route(LOCAL_INVENTORY, inventory, methods=["GET"]),
        Route(LOCAL_REGISTRATION, registration, methods=["GET"]),
        Route(LOCAL_HEALTH, health, methods=["GET"]),
    ]
    return Starlette(routes=routes)
