"""The audit log, written from the event stream (workers/audit.py) and nowhere else.

One row per CloudEvent (but the NOT_AUDITED kinds), keyed by the event id: a redelivered
event, or one delivered to two consumers, inserts nothing the second time. Details are
the event's data without the id the subject already names (node_id, token_id or
incident_id).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from schemas.events import NOT_AUDITED, SUBJECT_IDS, SUBJECT_PREFIX, CloudEvent
from store.models import AuditEntry


def _details(event: CloudEvent) -> dict[str, Any]:
    kind = event.subject.removeprefix(f"{SUBJECT_PREFIX}.").partition(".")[0]
    named = SUBJECT_IDS.get(kind)
    return {key: value for key, value in event.data.items() if key != named}


def row(event: CloudEvent) -> dict[str, Any]:
    return {
        "event_id": event.id,
        "at": event.time,
        "actor": event.actor,
        "action": event.action,
        "target_type": event.targettype,
        "target_id": event.targetid,
        "correlation_id": event.correlationid,
        "details": _details(event),
    }


async def append(session: AsyncSession, events: Sequence[CloudEvent]) -> int:
    """Insert the events' rows, in the given order, skipping any already there and the
    kinds that are not audited (schemas.events.NOT_AUDITED); how many were new."""
    rows = [row(event) for event in events if event.action not in NOT_AUDITED]
    if not rows:
        return 0
    statement = (
        insert(AuditEntry)
        .values(rows)
        .on_conflict_do_nothing(index_elements=[AuditEntry.event_id])
        .returning(AuditEntry.id)
    )
    return len((await session.execute(statement)).all())


_BACKLOG: Final = text(
    "SELECT (SELECT count(*) FROM inventory_observations),"
    " (SELECT count(*) FROM outbox o WHERE NOT (o.envelope->>'action' = ANY(:unaudited))"
    "  AND NOT EXISTS (SELECT 1 FROM audit_log a WHERE a.event_id = o.id))"
).bindparams(unaudited=sorted(NOT_AUDITED))


@dataclass(frozen=True)
class Backlog:
    """What the workers have still to do, in one snapshot."""

    # Accepted inventory reports not reconciled yet.
    unreconciled: int
    # Committed events (of the audited kinds) without their audit row.
    unaudited: int

    @property
    def settled(self) -> bool:
        return self.unreconciled == 0 and self.unaudited == 0


async def backlog(connection: AsyncConnection | AsyncSession) -> Backlog:
    row = (await connection.execute(_BACKLOG)).one()
    return Backlog(unreconciled=int(row[0]), unaudited=int(row[1]))
