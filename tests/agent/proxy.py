"""A fault-injecting HTTP proxy in front of the real API, for the failure paths.

Modes: "forward" (relay to the API), "503" and "429" (answer that status at once with a
body that echoes the request's body and Authorization header: if an agent ever logged a
response body, its secrets would show up in its log), "hang" (never answer), and stop()
closes the port (connection refused) until start() opens it again.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

from tests.api_server import free_port

RELAYED = ("content-type", "x-correlation-id", "retry-after", "www-authenticate")


class FaultProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.port = free_port()
        self.mode = "forward"
        self._server: ThreadingHTTPServer | None = None
        self._client = httpx.Client(base_url=upstream, timeout=30, trust_env=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, format: str, *args: object) -> None:
                return None

            def _handle(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                mode = proxy.mode
                if mode == "hang":
                    deadline = time.monotonic() + 10
                    while proxy.mode == "hang" and time.monotonic() < deadline:
                        time.sleep(0.05)
                    return  # close without an answer
                if mode in ("503", "429"):
                    echo = json.dumps(
                        {
                            "code": "internal_error",
                            "message": "echo",
                            "correlation_id": "proxy",
                            "details": [],
                            "extra": {
                                "body": body.decode(errors="replace"),
                                "authorization": self.headers.get("authorization", ""),
                            },
                        }
                    ).encode()
                    self.send_response(int(mode))
                    self.send_header("content-type", "application/json")
                    self.send_header("retry-after", "0")
                    self.send_header("content-length", str(len(echo)))
                    self.end_headers()
                    self.wfile.write(echo)
                    return
                headers = {
                    k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")
                }
                upstream = proxy._client.request(
                    self.command, self.path, content=body, headers=headers
                )
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
