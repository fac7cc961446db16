"""The agent's one exception hierarchy.

Every failed request becomes a :class:`RequestFailed` that carries what an operator needs
to diagnose it (method, path, status, failure class, error code, correlation id) and
nothing else: never the response body, never a secret.

    AgentError
    ├── ConfigError            the configuration cannot work
    ├── StateError             the state dir is missing, unreadable or inconsistent
    └── RequestFailed          one request to the API failed
        ├── Transient          transport error, 5xx or 429: retried with backoff, a
        │                      bounded number of times per payload
        ├── Rejected           401/403: stop publishing (revoked, disabled, ...)
        ├── Conflict           409: replayed sequence (the cursor jumps), protocol
        │                      version or identity (stop), other codes (final)
        └── Refused            any other 4xx, or an answer we cannot read: final for
                               that payload, which is dropped (logged once)
"""

from __future__ import annotations

import logging
from enum import StrEnum

from pydantic import ValidationError

from schemas.errors import ErrorCode


class FailureClass(StrEnum):
    DNS = "dns"
    REFUSED = "refused"
    TLS = "tls"
    TIMEOUT = "timeout"
    # Any other transport failure: reset, closed mid-answer, unreachable network.
    CONNECTION = "connection"
    # The API answered with an error status.
    HTTP = "http"
    # The API answered 2xx with something that is not the protocol's answer.
    RESPONSE = "response"


class AgentError(Exception):
    """Base of everything the agent raises on purpose."""


class ConfigError(AgentError):
    pass


class StateError(AgentError):
    pass


class RequestFailed(AgentError):
    def __init__(
        self,
        *,
        method: str,
        path: str,
        failure_class: FailureClass,
        status: int | None = None,
        code: ErrorCode | None = None,
        correlation_id: str | None = None,
        detail: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        self.method = method
        self.path = path
        self.failure_class = failure_class
        self.status = status
        self.code = code
        self.correlation_id = correlation_id
        # A short, safe description (e.g. "connection refused"); never a response body.
        self.detail = detail
        self.retry_after_s = retry_after_s
        super().__init__(self.describe())

    def describe(self) -> str:
        """One line: what failed and why, with nothing secret in it."""
        parts = [
            f"method={self.method}",
            f"path={self.path}",
            f"status={self.status if self.status is not None else 'none'}",
            f"class={self.failure_class.value}",
        ]
        if self.code is not None:
            parts.append(f"code={self.code.value}")
        if self.detail:
            parts.append(f"detail={self.detail!r}")
        if self.correlation_id:
            parts.append(f"correlation_id={self.correlation_id}")
        return " ".join(parts)


class Transient(RequestFailed):
    """Worth retrying: the request may succeed later unchanged."""


class Refused(RequestFailed):
    """A 4xx that retrying cannot fix (404, 405, 413, 422) or an unreadable answer."""


class RejectionKind(StrEnum):
    REVOKED = "revoked"
    INVALID = "invalid"
    DECOMMISSIONED = "decommissioned"
    DISABLED = "disabled"
    MISMATCH = "mismatch"
    ENROLLMENT_TOKEN = "enrollment_token"


_ADVICE = {
    RejectionKind.REVOKED: (
        "the node credential was revoked by an operator. If it was rotated, install the "
        "replacement with `modelforge agent install-credential --state-dir <state_dir>` "
        "(the agent picks it up, or restart it). If it was revoked on purpose, the node "
        "needs a recovery enrollment token for its node id."
    ),
    RejectionKind.INVALID: (
        "the control plane does not accept this credential (unknown or malformed): check "
        "that api_url points at the control plane this node enrolled with, and that the "
        "state dir is this node's. To re-bind the identity, an operator issues a recovery "
        "enrollment token for the node id."
    ),
    RejectionKind.DECOMMISSIONED: (
        "this node was permanently decommissioned and its identity can never be used "
        "again. If the host should rejoin, move the state dir away and enroll it as a new "
        "node with a new enrollment token."
    ),
    RejectionKind.DISABLED: (
        "an operator disabled this node. Re-enable it (PATCH "
        "/api/v1/admin/hardware/nodes/<node_id> with enabled=true), then restart the agent."
    ),
    RejectionKind.MISMATCH: (
        "the credential belongs to a different node than the node id in the state dir: the "
        "state dir is inconsistent. Restore it from a backup or enroll anew."
    ),
    RejectionKind.ENROLLMENT_TOKEN: (
        "the enrollment token was refused (unknown, used, expired or revoked): ask an "
        "operator for a new one (POST /api/v1/admin/hardware/enrollment-tokens)."
    ),
}

_KINDS = {
    ErrorCode.CREDENTIAL_REVOKED: RejectionKind.REVOKED,
    ErrorCode.CREDENTIAL_INVALID: RejectionKind.INVALID,
    ErrorCode.CREDENTIAL_MALFORMED: RejectionKind.INVALID,
    ErrorCode.CREDENTIAL_MISSING: RejectionKind.INVALID,
    ErrorCode.NODE_DECOMMISSIONED: RejectionKind.DECOMMISSIONED,
    ErrorCode.NODE_DISABLED: RejectionKind.DISABLED,
    ErrorCode.NODE_MISMATCH: RejectionKind.MISMATCH,
    ErrorCode.ENROLLMENT_TOKEN_INVALID: RejectionKind.ENROLLMENT_TOKEN,
    ErrorCode.ENROLLMENT_TOKEN_USED: RejectionKind.ENROLLMENT_TOKEN,
    ErrorCode.ENROLLMENT_TOKEN_EXPIRED: RejectionKind.ENROLLMENT_TOKEN,
    ErrorCode.ENROLLMENT_TOKEN_REVOKED: RejectionKind.ENROLLMENT_TOKEN,
}


def rejection_kind(status: int, code: ErrorCode | None) -> RejectionKind:
    if code is not None and code in _KINDS:
        return _KINDS[code]
    # An unknown code (a newer server): the status still says which family it is.
    return RejectionKind.DISABLED if status == 403 else RejectionKind.INVALID


class Rejected(RequestFailed):
    """401/403: the control plane refuses this node. Publishing stops."""

    @property
    def kind(self) -> RejectionKind:
        return rejection_kind(self.status or 401, self.code)

    @property
    def advice(self) -> str:
        return _ADVICE[self.kind]


# 409 codes after which publishing cannot go on unchanged.
_FATAL_CONFLICTS = {
    ErrorCode.PROTOCOL_VERSION_UNSUPPORTED: (
        "the control plane does not support this agent's protocol version: upgrade the agent"
    ),
    ErrorCode.IDENTITY_CONFLICT: (
        "the enrollment token does not match this node's identity: ask an operator for a "
        "token issued for this node id, or enroll as a new node"
    ),
    ErrorCode.NODE_TERMINAL: (
        "this node was decommissioned; move the state dir away and enroll as a new node"
    ),
}


class Conflict(RequestFailed):
    """409. A replayed sequence carries the server's cursor; the protocol and identity
    codes are fatal; any other (a newer server's code, state_conflict) only refuses that
    one payload."""

    # The server's cursor of the stream, from the error body (sequence_replayed only).
    cursor: int | None = None

    @property
    def fatal(self) -> bool:
        # Only the codes known to refuse every later payload too stop the agent; an
        # unknown one is taken as a refusal of this payload, like any other 4xx.
        return self.code in _FATAL_CONFLICTS

    @property
    def advice(self) -> str:
        if self.code in _FATAL_CONFLICTS:
            return _FATAL_CONFLICTS[self.code]
        if self.code == ErrorCode.SEQUENCE_REPLAYED:
            return "the stream cursor is behind the server's; it is moved past it"
        return "the control plane refused the request as conflicting; see its logs"


def stops_publishing(error: AgentError) -> bool:
    """True for refusals after which the agent must stop rather than retry."""
    return isinstance(error, Rejected) or (isinstance(error, Conflict) and error.fatal)


def final_for_payload(error: AgentError) -> bool:
    """True for a refusal of one payload (any 4xx but 401/403 and the fatal 409s, or an
    unreadable answer): sending it again cannot help, so it is dropped, not retried."""
    return (
        isinstance(error, RequestFailed)
        and not isinstance(error, Transient | Rejected)
        and not stops_publishing(error)
    )


def advice_for(error: AgentError) -> str:
    if isinstance(error, Rejected | Conflict):
        return error.advice
    return str(error)


def invalid_fields(exc: ValidationError) -> str:
    """Where a value failed its wire type, never the value: it may hold a secret (an
    enrollment answer) or text a log line should not carry (a control character)."""
    fields = sorted({".".join(str(p) for p in e["loc"]) for e in exc.errors()})
    return ", ".join(fields)[:200]


def log_unexpected(logger: logging.Logger, message: str, exc: BaseException) -> None:
    """`message` and what went wrong, for an error no caller expected. A ValidationError
    is logged by its invalid fields alone: its text repeats the input."""
    if isinstance(exc, ValidationError):
        logger.error("%s: invalid fields: %s", message, invalid_fields(exc))
    else:
        logger.error("%s", message, exc_info=exc)
