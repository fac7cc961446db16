"""The refusals of the rules, in one hierarchy: every rule in store/ (leases and their
kinds, nodes, enrollment, credentials, ingest, fleet, service clients) says no with one
of these, each carrying its ErrorCode, and the API maps them to HTTP once, by class
(api/handlers.py: _STORE_STATUS). A worker that meets one simply leaves the row alone.

api/errors.py keeps only what the API layer refuses by itself (a request's headers, the
operator key, the gateway's bounds, a held stream), which no rule decides.
"""

from __future__ import annotations

from typing import Any

from schemas.errors import ErrorCode


class StoreError(Exception):
    def __init__(
        self, message: str, *, code: ErrorCode, extra: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.extra = extra or {}


class Unauthenticated(StoreError):
    """The presented credential or token does not admit its holder: unknown, wrong,
    malformed, revoked, used or expired, or its node decommissioned (401)."""


class Forbidden(StoreError):
    """Authenticated, but this caller may not do this: a disabled node (403)."""


class NotOwned(Forbidden):
    """It exists, but belongs to another node (403)."""


class Missing(StoreError):
    """The object does not exist (404)."""


class Conflict(StoreError):
    """The recorded state forbids this now: a stale lease, a finished job, a replayed
    sequence, another node's identity, a decommissioned node, an unsupported protocol
    version (409)."""


class Invalid(StoreError):
    """The request names something the rules do not allow, e.g. a root the node does not
    offer (422)."""
