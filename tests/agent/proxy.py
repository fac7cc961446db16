"""A fault-injecting HTTP proxy in front of the real API, for the failure paths.

Modes: "forward" (relay to the API), "503" and "429" (answer that status at once with a
body that echoes the request's body and Authorization header: if an agent ever logged a
response body, its secrets would show up in its log), "hang" (never answer), and stop()
closes the port (connection refused) until start() opens it again.

script(path, ...) queues answers for the next requests to one path, ahead of the mode:
an error status with its code and `extra` (the body echoed as above), or CLOSE (the
connection closed without an answer, a transport error); script_matching(pattern, ...)
does the same for every path the regular expression matches whole (a path that names
a job not created yet). Every request is recorded in
`seen`, with the sequence number of its body and what the proxy answered.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from tests.api_server import free_port

RELAYED = ("content-type", "x-correlation-id", "retry-after", "www-authenticate")
CLOSE = 0  # a scripted "status": close the connection without an answer


@dataclass(frozen=True)
class Scripted:
    status: int
    code: str = "internal_error"
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    # What the proxy answered: the API's status when forwarded, CLOSE when it closed.
    status: int
    sequence: int | None
    correlation_id: str | None
    at: float


def _sequence(body: bytes) -> int | None:
    try:
        value = json.loads(body).get("sequence")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, int) else None


class FaultProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.port = free_port()
        self.mode = "forward"
        self.seen: list[Seen] = []
        self._scripts: dict[str, list[Scripted]] = {}
        self._patterns: list[tuple[re.Pattern[str], list[Scripted]]] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._client = httpx.Client(base_url=upstream, timeout=30, trust_env=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def script(self, path: str, *answers: Scripted) -> None:
        with self._lock:
            self._scripts.setdefault(path, []).extend(answers)

    def script_matching(self, pattern: str, *answers: Scripted) -> None:
        with self._lock:
            self._patterns.append((re.compile(pattern), list(answers)))

    def requests_to(self, path: str) -> list[Seen]:
        with self._lock:
            return [seen for seen in self.seen if seen.path == path]

    def _next_scripted(self, path: str) -> Scripted | None:
        with self._lock:
            queued = self._scripts.get(path)
            if not queued:
                matched = (q for p, q in self._patterns if q and p.fullmatch(path))
                queued = next(matched, None)
            return queued.pop(0) if queued else None

    def _record(self, handler: BaseHTTPRequestHandler, status: int, body: bytes) -> None:
        seen = Seen(
            method=handler.command,
            path=handler.path,
            status=status,
            sequence=_sequence(body),
            correlation_id=handler.headers.get("x-correlation-id"),
            at=time.monotonic(),
        )
        with self._lock:
            self.seen.append(seen)

    def start(self) -> FaultProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, format: str, *args: object) -> None:
                return None

            def _error(self, answer: Scripted, body: bytes) -> None:
                echo = json.dumps(
                    {
                        "code": answer.code,
                        "message": "echo",
                        "correlation_id": "proxy",
                        "details": [],
                        "extra": {
                            **answer.extra,
                            "body": body.decode(errors="replace"),
                            "authorization": self.headers.get("authorization", ""),
                        },
                    }
                ).encode()
                self.send_response(answer.status)
                self.send_header("content-type", "application/json")
                self.send_header("retry-after", "0")
                # As the API does: the agent's correlation id comes back.
                if "x-correlation-id" in self.headers:
                    self.send_header("x-correlation-id", self.headers["x-correlation-id"])
                self.send_header("content-length", str(len(echo)))
                self.end_headers()
                self.wfile.write(echo)

            def _handle(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                scripted = proxy._next_scripted(self.path)
                if scripted is not None:
                    proxy._record(self, scripted.status, body)
                    if scripted.status != CLOSE:
                        self._error(scripted, body)
                    return  # CLOSE: no answer at all
                mode = proxy.mode
                if mode == "hang":
                    deadline = time.monotonic() + 10
                    while proxy.mode == "hang" and time.monotonic() < deadline:
                        time.sleep(0.05)
                    return  # close without an answer
                if mode in ("503", "429"):
                    proxy._record(self, int(mode), body)
                    self._error(Scripted(int(mode)), body)
                    return
                headers = {
                    k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")
                }
                upstream = proxy._client.request(
                    self.command, self.path, content=body, headers=headers
                )
                proxy._record(self, upstream.status_code, body)
                self.send_response(upstream.status_code)
                for name in RELAYED:
                    if name in upstream.headers:
                        self.send_header(name, upstream.headers[name])
                self.send_header("content-length", str(len(upstream.content)))
                self.end_headers()
                self.wfile.write(upstream.content)

            do_GET = do_POST = do_PUT = do_PATCH = _handle

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def close(self) -> None:
        self.stop()
        self._client.close()
