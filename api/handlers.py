"""Exceptions to HTTP, in one place. Every error leaves as an ErrorBody with the correlation id,
or, on the gateway's paths, in OpenAI's envelope: `error_response` is the one renderer,
which the middleware that answers before any route (the body limit) calls too.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import compile_path
from starlette.types import ExceptionHandler, Receive, Scope, Send

from api.errors import ApiError
from api.gateway.locations import input_location
from api.route_credentials import require_route_credential
from api.state import state_of
from schemas.errors import ErrorBody, ErrorCode, FieldError
from schemas.gateway import GatewayErrorBody, GatewayErrorDetail
from schemas.protocol import GATEWAY_PREFIX
from store.correlation import current_correlation_id
from store.engine import database_down
from store.errors import Conflict, Forbidden, Invalid, Missing, StoreError, Unauthenticated

logger = logging.getLogger("modelforge.api")

_HTTP_CODES = {
    404: ErrorCode.NOT_FOUND,
    405: ErrorCode.METHOD_NOT_ALLOWED,
    413: ErrorCode.BODY_TOO_LARGE,
}


def on_gateway(path: str) -> bool:
    return path == GATEWAY_PREFIX or path.startswith(GATEWAY_PREFIX + "/")


# Where a validation error's location starts: FastAPI's own first segment, not the field.
_SOURCES = frozenset({"body", "query", "path", "header", "cookie"})


def gateway_error(status: int, body: ErrorBody) -> GatewayErrorBody:
    """A refusal in OpenAI's envelope (its clients read `error.message`), with our code
    and correlation id inside it; `param` names the first field a validation refused."""
    param = None
    if body.details:
        location = [str(part) for part in body.details[0].location]
        if location and location[0] in _SOURCES:
            location = location[1:]
        param = ".".join(location) or None
    return GatewayErrorBody(
        error=GatewayErrorDetail(
            message=body.message,
            type="server_error" if status >= 500 else "invalid_request_error",
            param=param,
            code=body.code.value,
            correlation_id=body.correlation_id,
        )
    )


def error_response(
    path: str, status: int, body: ErrorBody, headers: dict[str, str] | None = None
) -> JSONResponse:
    """The one renderer of a refusal: OpenAI's envelope on the gateway's paths (an
    unknown one under it included), the ErrorBody everywhere else."""
    if on_gateway(path):
        content = gateway_error(status, body).model_dump(mode="json")
    else:
        content = body.model_dump(mode="json")
    return JSONResponse(status_code=status, content=content, headers=headers)


async def send_refusal(
    scope: Scope,
    receive: Receive,
    send: Send,
    status: int,
    code: ErrorCode,
    message: str,
    headers: dict[str, str] | None = None,
) -> None:
    """A refusal from ASGI middleware, before any route or exception handler: rendered
    as error_response renders it, with the request's correlation id."""
    body = ErrorBody(code=code, message=message, correlation_id=current_correlation_id() or "")
    answer = error_response(scope["path"], status, body, _headers(status, headers))
    await answer(scope, receive, send)


def _headers(status: int, extra: dict[str, str] | None) -> dict[str, str] | None:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
    headers.update(extra or {})
    return headers or None


def _respond(
    request: Request, status: int, body: ErrorBody, headers: dict[str, str] | None = None
) -> JSONResponse:
    return error_response(request.url.path, status, body, headers)


def _refusal(
    request: Request,
    status: int,
    code: ErrorCode,
    message: str,
    extra: dict[str, object],
    extra_headers: dict[str, str] | None = None,
) -> JSONResponse:
    if status in (401, 403):
        state_of(request).metrics.auth_failures.labels(code.value).inc()
    body = ErrorBody(
        code=code, message=message, correlation_id=current_correlation_id() or "", extra=extra
    )
    return _respond(request, status, body, _headers(status, extra_headers))


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return _refusal(request, exc.status_code, exc.code, exc.message, exc.extra, exc.headers)


# The rules' refusals (store/errors.py), by class; a subclass (NotOwned) answers as
# its base (Forbidden).
_STORE_STATUS: dict[type[StoreError], int] = {
    Unauthenticated: 401,
    Forbidden: 403,
    Missing: 404,
    Conflict: 409,
    Invalid: 422,
}


async def _store_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StoreError)
    status = next(code for kind, code in _STORE_STATUS.items() if isinstance(exc, kind))
    return _refusal(request, status, exc.code, exc.message, exc.extra)


async def _unless_unauthenticated(request: Request) -> JSONResponse | None:
    """The refusal of the route's credential when the caller lacks it: a 422 is told
    only to a caller the route admits (api/route_credentials.py)."""
    try:
        await require_route_credential(request)
    except ApiError as exc:
        return await _api_error(request, exc)
    except StoreError as exc:
        return await _store_error(request, exc)
    except (DBAPIError, ConnectionError) as exc:
        return await _database_error(request, exc)
    return None


def _unparseable(request: Request) -> JSONResponse:
    body = ErrorBody(
        code=ErrorCode.BODY_UNPARSEABLE,
        message="the request body is not valid JSON",
        correlation_id=current_correlation_id() or "",
    )
    return _respond(request, 422, body)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    refused = await _unless_unauthenticated(request)
    if refused is not None:
        return refused
    errors = exc.errors()
    if any(error["type"] == "json_invalid" for error in errors):
        return _unparseable(request)
    gateway = on_gateway(request.url.path)
    # Location, message and type only: the offending input may be a secret.
    details = [
        FieldError(
            location=_location(error, exc.body) if gateway else list(error.get("loc", ())),
            message=error["msg"],
            type=error["type"],
        )
        for error in errors
    ]
    # A validator that refuses with an error code of the contract (a refused llama-server
    # flag) makes it the response's code, with what the refusal names.
    typed = [error for error in errors if error["type"] in _TYPED_VALIDATION]
    code, message, extra = ErrorCode.VALIDATION_FAILED, "the request does not match the schema", {}
    if typed:
        code = ErrorCode(typed[0]["type"])
        message = "; ".join(error["msg"] for error in typed)
        extra = {"flags": [flag for error in typed for flag in error["ctx"].get("flags", [])]}
    if gateway and not typed and details:
        # OpenAI's clients show `error.message` alone: it names the field and why.
        first = details[0]
        message = f"{'.'.join(str(part) for part in first.location[1:])}: {first.message}"
    body = ErrorBody(
        code=code,
        message=message,
        correlation_id=current_correlation_id() or "",
        details=details,
        extra=extra,
    )
    return _respond(request, 422, body)


def _location(error: Any, body: Any) -> list[int | str]:
    """A gateway refusal's location: the source, then the field as the client wrote it."""
    location = list(error.get("loc", ()))
    if not location or location[0] not in _SOURCES:
        return location
    return [location[0], *input_location(location[1:], body, error["type"])]


_TYPED_VALIDATION = frozenset({ErrorCode.SERVER_FLAG_REFUSED.value})


class AllowedMethods:
    """Every method a path takes, for the Allow header of a 405.

    Starlette names only the methods of the first route whose path matched, and a path
    often has two (GET and PATCH on a node). The OpenAPI document lists them all; it is
    read once, at the first 405.
    """

    def __init__(self, app: FastAPI) -> None:
        self._app = app
        self._paths: list[tuple[re.Pattern[str], set[str]]] | None = None

    def __call__(self, path: str) -> str:
        if self._paths is None:
            self._paths = [
                (compile_path(template)[0], {method.upper() for method in operations})
                for template, operations in self._app.openapi()["paths"].items()
            ]
        methods: set[str] = set()
        for pattern, documented in self._paths:
            if pattern.match(path):
                methods |= documented
        if "GET" in methods:
            methods.add("HEAD")  # Starlette answers HEAD wherever it answers GET
        return ", ".join(sorted(methods))


def _http_error_handler(allowed: AllowedMethods) -> ExceptionHandler:
    async def handle(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        headers = dict(exc.headers) if exc.headers else {}
        if exc.status_code == 405:
            headers["Allow"] = allowed(request.url.path)
        if exc.status_code == 400:  # a body that does not decode: told after the credential
            refused = await _unless_unauthenticated(request)
            if refused is not None:
                return refused
        return _http_error(request, exc, headers)

    return handle


def _http_error(
    request: Request, exc: StarletteHTTPException, headers: dict[str, str]
) -> JSONResponse:
    if exc.status_code == 400:
        # FastAPI's body reader raises a bare 400 for what json.loads cannot take apart
        # (invalid UTF-8, deep nesting, 5,000-digit numbers): the client's mistake, 422.
        return _unparseable(request)
    code = _HTTP_CODES.get(exc.status_code, ErrorCode.INTERNAL_ERROR)
    body = ErrorBody(
        code=code, message=str(exc.detail), correlation_id=current_correlation_id() or ""
    )
    return _respond(request, exc.status_code, body, headers or None)


async def _database_error(request: Request, exc: Exception) -> JSONResponse:
    if not database_down(exc):
        raise exc  # a bug: the outermost middleware answers 500 and logs it
    logger.warning("database unavailable: %s", type(exc).__name__)
    body = ErrorBody(
        code=ErrorCode.DATABASE_UNAVAILABLE,
        message="the database is unavailable; retry shortly",
        correlation_id=current_correlation_id() or "",
    )
    # The pool drops every broken connection at the first failure, so a retry after a
    # database restart gets a fresh one.
    return _respond(request, 503, body, {"Retry-After": "1"})


def install_exception_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(StoreError, _store_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error_handler(AllowedMethods(app)))
    app.add_exception_handler(DBAPIError, _database_error)
    app.add_exception_handler(ConnectionError, _database_error)
