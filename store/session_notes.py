"""Notes a transaction leaves for the process that commits it: which cached things it
changed, so that process drops them right after the commit, before it answers, instead
of waiting for its own NOTIFY to come back (every other process waits for that one).

A note is kept in `session.info` under its kind and taken once (api/deps.py).
"""

from __future__ import annotations

import uuid
from typing import Final

from sqlalchemy.ext.asyncio import AsyncSession

# What a note is about: a node's standing (store/nodes.py), a service client's secret
# or revocation (store/deployments/service_clients.py).
NODE_STANDING: Final = "modelforge.changed_standing"
SERVICE_CLIENT: Final = "modelforge.changed_service_client"


def note(session: AsyncSession, kind: str, row_id: uuid.UUID) -> None:
    session.info.setdefault(kind, set()).add(row_id)


def take(session: AsyncSession, kind: str) -> set[uuid.UUID]:
    """The ids noted under `kind` since the last call (the note is taken)."""
    noted: set[uuid.UUID] = session.info.pop(kind, set())
    return noted
