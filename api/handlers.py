"""Exceptions to HTTP, in one place. Every error leaves as an ErrorBody with the correlation id."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.errors import ApiError
from schemas.errors import ErrorBody, ErrorCode, FieldError
from store.correlation import current_correlation_id

_HTTP_CODES = {
    404: ErrorCode.NOT_FOUND,
    405: ErrorCode.METHOD_NOT_ALLOWED,
    413: ErrorCode.BODY_TOO_LARGE,
}


def _respond(status: int, body: ErrorBody, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content=body.model_dump(mode="json"), headers=headers)


async def _api_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    body = ErrorBody(
        code=exc.code,
        message=exc.message,
        correlation_id=current_correlation_id() or "",
        extra=exc.extra,
    )
    headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
    return _respond(exc.status_code, body, headers)


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    # Location, message and type only: the offending input may be a secret.
    details = [
        FieldError(location=list(error.get("loc", ())), message=error["msg"], type=error["type"])
        for error in exc.errors()
    ]
    body = ErrorBody(
        code=ErrorCode.VALIDATION_FAILED,
        message="the request does not match the schema",
        correlation_id=current_correlation_id() or "",
        details=details,
    )
    return _respond(422, body)


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _HTTP_CODES.get(exc.status_code, ErrorCode.INTERNAL_ERROR)
    body = ErrorBody(
        code=code, message=str(exc.detail), correlation_id=current_correlation_id() or ""
    )
    return _respond(exc.status_code, body, dict(exc.headers) if exc.headers else None)


def install_exception_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
