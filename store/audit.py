"""The audit log, written from the event stream (workers/audit.py) and nowhere else, and
read by operators (`query`, the admin route's: api/admin/routes.py).

One row per CloudEvent (but the NOT_AUDITED kinds), keyed by the event id: a redelivered
event, or one delivered to two consumers, inserts nothing the second time. Details are
the event's data without the id the subject already names (node_id, token_id or
incident_id).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import func, or_, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from schemas.admin import AUDIT_HEALTH_CHECK_KINDS, AuditList, AuditQuery, AuditRecord
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


async def query(session: AsyncSession, asked: AuditQuery) -> AuditList:
    """The audit log for an operator: newest first, every given field matched exactly,
    keyset-paginated by id (`next_before_id` is the next page's `before_id`); the
    health-check jobs' rows only when asked for."""
    statement = select(AuditEntry).order_by(AuditEntry.id.desc()).limit(asked.limit + 1)
    exact = {
        AuditEntry.actor: asked.actor,
        AuditEntry.action: asked.action,
        AuditEntry.target_type: asked.target_type,
        AuditEntry.target_id: asked.target_id,
        AuditEntry.correlation_id: asked.correlation_id,
    }
    for column, value in exact.items():
        if value is not None:
            statement = statement.where(column == value)
    family = func.split_part(AuditEntry.action, ".", 1)
    if asked.kind is not None:
        statement = statement.where(family == asked.kind)
    if asked.node_id is not None:
        node = str(asked.node_id)
        statement = statement.where(
            or_(
                (AuditEntry.target_type == "node") & (AuditEntry.target_id == node),
                AuditEntry.details["node_id"].astext == node,
            )
        )
    if not asked.health_checks:
        # A row without a job kind (NULL) is not a health check: coalesced, not dropped.
        job_kind = func.coalesce(AuditEntry.details["kind"].astext, "")
        statement = statement.where(or_(family != "job", job_kind.not_in(AUDIT_HEALTH_CHECK_KINDS)))
    if asked.since is not None:
        statement = statement.where(AuditEntry.at >= asked.since)
    if asked.until is not None:
        statement = statement.where(AuditEntry.at < asked.until)
    if asked.before_id is not None:
        statement = statement.where(AuditEntry.id < asked.before_id)
    rows = list((await session.execute(statement)).scalars())
    more = len(rows) > asked.limit
    rows = rows[: asked.limit]
    return AuditList(
        items=[
            AuditRecord(
                id=row.id,
                at=row.at,
                actor=row.actor,
                action=row.action,
                target_type=row.target_type,
                target_id=row.target_id,
                correlation_id=row.correlation_id,
                details=row.details,
            )
            for row in rows
        ],
        next_before_id=rows[-1].id if more and rows else None,
    )
