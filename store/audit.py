"""Audit rows, written by the caller inside the transaction of the change they record."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from store.correlation import current_correlation_id
from store.models import AuditEntry

OPERATOR = "operator"
# Decisions the control plane makes by itself (liveness sweeps).
SYSTEM = "system"


def node_actor(node_id: object) -> str:
    return f"node:{node_id}"


def record(
    session: AsyncSession,
    *,
    actor: str,
    action: str,
    target_type: str,
    target_id: object,
    details: dict[str, Any] | None = None,
) -> None:
    session.add(
        AuditEntry(
            actor=actor,
            action=action,
            target_type=target_type,
            target_id=str(target_id),
            correlation_id=current_correlation_id(),
            details=details or {},
        )
    )
