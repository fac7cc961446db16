"""Audit log query, newest first, keyset-paginated by id."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from schemas.admin import AuditList, AuditQuery, AuditRecord
from store.models import AuditEntry


async def query_audit(session: AsyncSession, query: AuditQuery) -> AuditList:
    statement = select(AuditEntry).order_by(AuditEntry.id.desc()).limit(query.limit + 1)
    exact = {
        AuditEntry.actor: query.actor,
        AuditEntry.action: query.action,
        AuditEntry.target_type: query.target_type,
        AuditEntry.target_id: query.target_id,
        AuditEntry.correlation_id: query.correlation_id,
    }
    for column, value in exact.items():
        if value is not None:
            statement = statement.where(column == value)
    if query.since is not None:
        statement = statement.where(AuditEntry.at >= query.since)
    if query.until is not None:
        statement = statement.where(AuditEntry.at < query.until)
    if query.before_id is not None:
        statement = statement.where(AuditEntry.id < query.before_id)
    rows = list((await session.execute(statement)).scalars())
    more = len(rows) > query.limit
    rows = rows[: query.limit]
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
