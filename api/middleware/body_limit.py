"""Refuse oversized bodies with 413 before anything parses them."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.handlers import send_refusal
from schemas.errors import ErrorCode


class BodyTooLarge(HTTPException):
    """An HTTPException so FastAPI's body reader re-raises it instead of turning it into 400."""

    def __init__(self) -> None:
        super().__init__(status_code=413, detail="request body too large")


class BodySizeLimitMiddleware:
    def __init__(
        self, app: ASGIApp, *, max_bytes: int, streamed_prefixes: tuple[str, ...] = ()
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        # Routes whose body is a stream they bound themselves (an invoke's answer).
        self.streamed_prefixes = streamed_prefixes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (
            self.streamed_prefixes and scope["path"].startswith(self.streamed_prefixes)
        ):
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = self.max_bytes + 1
                if declared > self.max_bytes:
                    await self._refuse(scope, receive, send)
                    return
        received = 0
        response_started = False

        # A chunked body has no length header: count what actually arrives.
        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge()
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal response_started
            if message["type"] == "http.response.start":
                response_started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except BodyTooLarge:
            if response_started:
                raise
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The exception handlers' renderer: OpenAI's envelope on the gateway's paths.
        message = f"request body exceeds {self.max_bytes} bytes"
        await send_refusal(scope, receive, send, 413, ErrorCode.BODY_TOO_LARGE, message)
