"""The correlation id of the unit of work being persisted.

Set by the API for each request and by workers for each message; stamped on every
audit row and event written meanwhile, and on every log line.
"""

from __future__ import annotations

from contextvars import ContextVar

correlation_id_var: ContextVar[str | None] = ContextVar("modelforge_correlation_id", default=None)


def current_correlation_id() -> str | None:
    return correlation_id_var.get()
