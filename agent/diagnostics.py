"""Diagnostics (M16): failure classification, the log setup and the failure log line.

A failed publication is logged as one line naming the operation, method, path, status
and failure class (dns, refused, tls, timeout, connection, http), the error code and the
correlation id. Never the response body (it can echo what the agent published) and never
a secret: the credential and the enrollment token only travel in request bodies and
headers, which nothing here logs, and a redacting filter on the handler masks anything
shaped like one as a second line of defence.
"""

from __future__ import annotations

import errno
import logging
import re
import socket
import ssl
import sys
from typing import TextIO

import httpx

from agent.errors import FailureClass, RequestFailed

# Loggers of libraries that could print requests (and so headers) at DEBUG.
QUIET_LOGGERS = ("httpx", "httpcore", "hpack", "h2", "h11", "urllib3", "asyncio")

# <prefix>.<32 hex id>.<secret>: keep the id (useful, not secret), mask the secret.
_SECRET_SHAPE = re.compile(r"\b(mf[ne])\.([0-9a-f]{32})\.[A-Za-z0-9_\-]{8,}")
_BEARER = re.compile(r"(?i)(bearer\s+)\S+")


def redact(text: str) -> str:
    text = _SECRET_SHAPE.sub(r"\1.\2.[redacted]", text)
    return _BEARER.sub(r"\1[redacted]", text)


class RedactingFormatter(logging.Formatter):
    """Formats as usual, then masks anything shaped like a credential or token."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def configure_logging(level: str, stream: TextIO | None = None) -> None:
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(RedactingFormatter(LOG_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    quiet_libraries()


def quiet_libraries() -> None:
    """Even with the agent at DEBUG, HTTP libraries never log below WARNING."""
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


_ERRNO = {
    errno.ECONNREFUSED: (FailureClass.REFUSED, "connection refused"),
    errno.ETIMEDOUT: (FailureClass.TIMEOUT, "timed out"),
    errno.ECONNRESET: (FailureClass.CONNECTION, "connection reset"),
    errno.EPIPE: (FailureClass.CONNECTION, "connection reset"),
    errno.ECONNABORTED: (FailureClass.CONNECTION, "connection aborted"),
    errno.EHOSTUNREACH: (FailureClass.CONNECTION, "host unreachable"),
    errno.ENETUNREACH: (FailureClass.CONNECTION, "network unreachable"),
}


def _causes(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen and len(seen) < 16:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _tls_detail(error: ssl.SSLError) -> str:
    if isinstance(error, ssl.SSLCertVerificationError) and error.verify_message:
        return f"certificate verify failed: {error.verify_message}"
    return str(error.reason or "handshake failed").lower().replace("_", " ")


def classify_transport(exc: httpx.TransportError) -> tuple[FailureClass, str]:
    """(failure class, short safe detail) of a failed connection or exchange."""
    # Nearest cause first: a handshake that timed out is a timeout, even though an
    # SSLWantReadError sits further down the chain.
    for cause in _causes(exc):
        if isinstance(cause, ssl.SSLWantReadError | ssl.SSLWantWriteError):
            continue
        if isinstance(cause, ssl.SSLError):
            return FailureClass.TLS, _tls_detail(cause)
        if isinstance(cause, socket.gaierror):
            return FailureClass.DNS, "name resolution failed"
        if isinstance(cause, ConnectionRefusedError):
            return FailureClass.REFUSED, "connection refused"
        if isinstance(cause, TimeoutError | socket.timeout):
            return FailureClass.TIMEOUT, "timed out"
        if isinstance(cause, OSError) and cause.errno in _ERRNO:
            return _ERRNO[cause.errno]
    if isinstance(exc, httpx.TimeoutException):
        return FailureClass.TIMEOUT, type(exc).__name__
    text = str(exc).lower()
    # httpcore re-raises some OS errors as its own types with only the message kept.
    if "name or service not known" in text or "temporary failure in name resolution" in text:
        return FailureClass.DNS, "name resolution failed"
    if "nodename nor servname" in text or "no address associated" in text:
        return FailureClass.DNS, "name resolution failed"
    if "connection refused" in text or f"errno {errno.ECONNREFUSED}" in text:
        return FailureClass.REFUSED, "connection refused"
    if "ssl" in text or "certificate" in text or "tls" in text:
        return FailureClass.TLS, "handshake failed"
    if isinstance(exc, httpx.RemoteProtocolError):
        return FailureClass.CONNECTION, "server closed the connection without an answer"
    # Transport messages carry OS and protocol errors, not request data; still redacted.
    message = redact(str(exc).strip())[:120]
    detail = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return FailureClass.CONNECTION, detail


def failure_line(operation: str, error: RequestFailed, outcome: str) -> str:
    """The one format of a failed publication, e.g.

    ``heartbeat failed: method=POST path=/api/v1/agent/heartbeat status=503 class=http
    code=internal_error correlation_id=...; retrying in 1.3s``
    """
    return f"{operation} failed: {error.describe()}; {outcome}"
