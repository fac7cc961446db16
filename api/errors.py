"""The API layer's own refusals: what no store rule decides, and what may carry headers.
A request's Authorization or operator-key header, the gateway's bounds and routing
(Retry-After), a held stream's refusals (Connection: close), a service we called
(dead letters, manifests). The rules refuse with store/errors.py's hierarchy instead;
api/handlers.py maps both to HTTP once, with the same body.
"""

from __future__ import annotations

from typing import Any

from schemas.errors import ErrorBody, ErrorCode


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for statuses a route can answer, each with the ErrorBody."""
    return {status: {"model": ErrorBody} for status in statuses}


class ApiError(Exception):
    status_code = 500
    default_code = ErrorCode.INTERNAL_ERROR

    def __init__(
        self,
        message: str,
        *,
        code: ErrorCode | None = None,
        extra: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.extra = extra or {}
        # Headers the answer carries (Retry-After).
        self.headers = headers or {}


class Unauthenticated(ApiError):
    """401: missing, malformed, unknown or revoked credential or token."""

    status_code = 401
    default_code = ErrorCode.CREDENTIAL_INVALID


class Forbidden(ApiError):
    """403: authenticated, but this caller may not do this (disabled node, someone else's)."""

    status_code = 403
    default_code = ErrorCode.NODE_MISMATCH


class NotFound(ApiError):
    status_code = 404
    default_code = ErrorCode.NOT_FOUND


class Conflict(ApiError):
    """409: protocol version, replayed sequence, identity or terminal-state conflicts."""

    status_code = 409
    default_code = ErrorCode.STATE_CONFLICT


class BadGateway(ApiError):
    """502: a service we called answered something we do not read (schemas/bounded.py)."""

    status_code = 502
    default_code = ErrorCode.SOURCE_INVALID


class ServiceUnavailable(ApiError):
    """503: a dependency (NATS for dead letters) cannot be reached right now, or (the
    gateway) no deployment is ready; Retry-After says when to try again."""

    status_code = 503
    default_code = ErrorCode.BROKER_UNAVAILABLE


class TooManyRequests(ApiError):
    """429: past a client's or a deployment's bound; Retry-After says when to come back."""

    status_code = 429
    default_code = ErrorCode.RATE_LIMITED


class BudgetExhausted(TooManyRequests):
    """429: a service client's tokens today reached its budget (max_tokens_per_day);
    Retry-After is the time to the next UTC midnight."""

    default_code = ErrorCode.BUDGET_EXHAUSTED
