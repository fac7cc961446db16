"""Request bodies are UTF-8 and nothing else (README: Wire rules), checked once for every
route.

json.loads, which FastAPI's body reader calls on bytes, sniffs their encoding: UTF-16
and UTF-32 (with or without a byte order mark) and UTF-8 behind a BOM all parsed, and
so created service clients and deployments and reached nodes through the gateway. The
middleware here runs every body through Python's strict UTF-8 decoder as the route
reads it (chunk by chunk, nothing buffered twice) and refuses a BOM; the first byte that
is not UTF-8 raises `BodyNotUtf8`, which FastAPI's body reader (or a route reading its
body itself) passes on and api/handlers.py answers 422 `body_unparseable` after the
route's credential, in OpenAI's envelope under /v1. The fleet's fast path, ahead of all
middleware (api/agent/fast_path.py), decodes its body with `decoded`, the same rule.
An invoke's answer stream is exempt: its body is llama-server's, relayed as it comes.
"""

from __future__ import annotations

import codecs

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

_BOM = "\ufeff"


class BodyNotUtf8(HTTPException):
    """An HTTPException so FastAPI's body reader re-raises it; 400 is what that reader
    raises for a body json.loads cannot take apart, answered 422 body_unparseable."""

    def __init__(self) -> None:
        super().__init__(status_code=400, detail="the request body is not UTF-8")


class Utf8Decoder:
    """A body's text, chunk by chunk: strict UTF-8, no byte order mark."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("strict")
        self._started = False

    def decode(self, chunk: bytes, final: bool) -> str:
        try:
            text = self._decoder.decode(chunk, final)
        except UnicodeDecodeError:
            raise BodyNotUtf8() from None
        if text and not self._started:
            self._started = True
            if text.startswith(_BOM):
                raise BodyNotUtf8()
        return text


def decoded(body: bytes) -> str:
    """A whole body's text, or BodyNotUtf8."""
    return Utf8Decoder().decode(body, final=True)


class Utf8BodyMiddleware:
    def __init__(self, app: ASGIApp, *, streamed_prefixes: tuple[str, ...] = ()) -> None:
        self.app = app
        self.streamed_prefixes = streamed_prefixes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (
            self.streamed_prefixes and scope["path"].startswith(self.streamed_prefixes)
        ):
            await self.app(scope, receive, send)
            return
        decoder = Utf8Decoder()

        async def checking_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                decoder.decode(message.get("body", b""), not message.get("more_body", False))
            return message

        await self.app(scope, checking_receive, send)
