"""The store's refusals: rules shared by the API and the workers (store/leases.py and
its kinds) say no with these, and the API maps them to HTTP once (api/handlers.py).
A worker that meets one simply leaves the row alone."""

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


class Missing(StoreError):
    """The object does not exist (404)."""


class NotOwned(StoreError):
    """It exists, but belongs to another node (403)."""


class Refused(StoreError):
    """The object's state forbids this now: a stale lease, a finished job (409)."""


class Invalid(StoreError):
    """The request names something the rules do not allow, e.g. a root the node does not
    offer (422)."""
