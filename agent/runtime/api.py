"""The runtime worker's local OpenAI-compatible endpoints, in front of the device slots.

Plain Starlette routes (no schema layer on this path): the body is passed through to
llama-server as it came, with only `model` checked and rewritten to the served name.
Errors use OpenAI's shape, `{"error": {"message", "type", "code"}}`:
* unknown model → 404 `model_not_found`; a body that is not a JSON object → 400;
* the device's bound reached → 429 with Retry-After;
* a server that is not ready within its startup timeout, or that died → 503 with
  Retry-After (never an upstream "Loading model" passed through).
A streamed answer (`"stream": true`) is relayed chunk by chunk; the device stays held
until its last chunk, so a model switch waits for it.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from agent.runtime.devices import Busy
from agent.runtime.server import ServerFailed
from agent.runtime.worker import RuntimeWorker
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
# Upstream headers worth relaying (hop-by-hop and length are the server's own business).
_RELAYED = ("content-type", "cache-control")
_JSON = {"Content-Type": "application/json"}


def openai_error(
    status: int, message: str, code: str, *, retry_after_s: int | None = None
) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 and status != 429 else "server_error"
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    body = {"error": {"message": message, "type": kind, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


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
        raw = await request.body()
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
        if body["model"] != model.served_name:
            body["model"] = model.served_name
            raw = json.dumps(body).encode()
        slot = worker.slot_for(model)
        held = contextlib.AsyncExitStack()
        try:
            server = await held.enter_async_context(slot.serving(model))
        except Busy as exc:
            return openai_error(429, str(exc), "device_busy", retry_after_s=RETRY_BUSY_S)
        except ServerFailed as exc:
            logger.warning("%s on %s: %s (%s)", model.model_id, slot.device.id, exc.code, exc)
            return openai_error(503, exc.detail, exc.code, retry_after_s=RETRY_NOT_READY_S)
        try:
            upstream = await server.relay.post(LOCAL_CHAT_COMPLETIONS, data=raw, headers=_JSON)
        except aiohttp.ClientError as exc:
            await held.aclose()
            detail = f"llama-server did not answer ({type(exc).__name__})"
            return openai_error(503, detail, "upstream_unavailable", retry_after_s=RETRY_BUSY_S)
        headers = {k: v for k, v in upstream.headers.items() if k.lower() in _RELAYED}
        if not body.get("stream"):
            try:
                content = await upstream.read()
            except aiohttp.ClientError:
                return openai_error(
                    503, "llama-server failed mid-answer", "upstream_unavailable", retry_after_s=1
                )
            finally:
                upstream.release()
                await held.aclose()
            return Response(content, status_code=upstream.status, headers=headers)

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in upstream.content.iter_any():
                    yield chunk
            except aiohttp.ClientError:
                logger.warning("%s: llama-server failed mid-stream", slot.device.id)
            finally:
                upstream.release()
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
