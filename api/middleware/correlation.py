"""Correlation IDs: echoed or generated, on every response and every log line."""

from __future__ import annotations

import logging
import re
import secrets

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.handlers import error_response
from schemas.errors import ErrorBody, ErrorCode
from schemas.protocol import CORRELATION_HEADER
from store.correlation import correlation_id_var

HEADER = CORRELATION_HEADER.lower()
_ACCEPTABLE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")

logger = logging.getLogger("modelforge.api")


HEADER_BYTES = HEADER.encode()


def incoming_correlation_id(scope: Scope) -> str | None:
    """The client's correlation id, if it sent an acceptable one."""
    for name, value in scope.get("headers", []):
        if name == HEADER_BYTES:
            text = value.decode("latin-1")
            # An unsafe value would end up in logs and headers: replace rather than echo.
            return text if _ACCEPTABLE.match(text) else None
    return None


class CorrelationIdMiddleware:
    """Outermost of ours, so even unhandled errors leave with a typed body and the header."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # 32 hex digits, as uuid4().hex, without building a UUID object on the hot path.
        correlation_id = incoming_correlation_id(scope) or secrets.token_hex(16)
        token = correlation_id_var.set(correlation_id)
        started = False

        async def send_with_header(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = [(k, v) for k, v in message.get("headers", []) if k != HEADER_BYTES]
                headers.append((HEADER_BYTES, correlation_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_header)
        except Exception:
            logger.exception("unhandled error on %s %s", scope["method"], scope["path"])
            if started:
                raise
            body = ErrorBody(
                code=ErrorCode.INTERNAL_ERROR,
                message="internal error",
                correlation_id=correlation_id,
            )
            # The exception handlers' renderer: OpenAI's envelope on the gateway's paths.
            await error_response(scope["path"], 500, body)(scope, receive, send_with_header)
        finally:
            correlation_id_var.reset(token)
