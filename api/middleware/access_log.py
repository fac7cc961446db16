"""One access record per request: the request's metrics (api/metrics.py) and, when the
process turned it on (MODELFORGE_ACCESS_LOG, `modelforge up --access-log`), a log line
(method, path, status, duration; never bodies or headers), from one status capture."""

from __future__ import annotations

import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.metrics import ApiMetrics

logger = logging.getLogger("modelforge.api.access")

UNMATCHED = "unmatched"


def configure_access_log(enabled: bool) -> None:
    """Whether this process writes the per-request lines. Off by default: at a fleet's
    cadence (heartbeats, telemetry, job polls of every node) they bury every other line,
    `up`'s banner and its one-time operator key included; the traffic is on /metrics."""
    logger.disabled = not enabled


def record_access(method: str, path: str, status: int, elapsed_s: float) -> None:
    """The access log line of one request (also written by api/agent/fast_path.py)."""
    # The path only, never the query string: filters could carry identifiers an
    # operator would rather not see in shared logs. It arrives percent-decoded, so a
    # client's %0a would end the line and forge the next one: spelled out instead.
    if not path.isprintable():
        path = path.encode("unicode_escape").decode("ascii")
    logger.info("%s %s %d %.1fms", method, path, status, elapsed_s * 1000)


class AccessLogMiddleware:
    def __init__(self, app: ASGIApp, *, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def capture_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, capture_status)
        finally:
            elapsed = time.perf_counter() - started
            method = scope["method"]
            record_access(method, scope["path"], status, elapsed)
            # The router writes the matched route into the scope it was given; its
            # template keeps the labels bounded and free of identifiers.
            template = getattr(scope.get("route"), "path", None) or UNMATCHED
            self.metrics.requests.labels(template, method, str(status)).inc()
            self.metrics.latency.labels(template, method).observe(elapsed)
