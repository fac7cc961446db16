"""Transactional outbox: an event row is written in the same transaction as its change."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncSession

from schemas.base import WireModel
from schemas.events import EVENT_PAYLOADS, CloudEvent, EventType
from store.correlation import current_correlation_id
from store.models import OutboxEvent


def emit(
    session: AsyncSession,
    event_type: EventType,
    *,
    target_id: uuid.UUID,
    payload: WireModel,
    node_id: uuid.UUID | None = None,
) -> uuid.UUID:
    expected = EVENT_PAYLOADS[event_type]
    if not isinstance(payload, expected):
        raise TypeError(f"{event_type} carries {expected.__name__}, got {type(payload).__name__}")
    event_id = uuid.uuid4()
    subject = event_type.subject(target_id)
    envelope = CloudEvent(
        id=event_id,
        type=event_type.cloudevent_type,
        subject=subject,
        time=datetime.now(UTC),
        correlationid=current_correlation_id(),
        nodeid=node_id,
        data=payload.model_dump(mode="json"),
    )
    session.add(
        OutboxEvent(id=event_id, subject=subject, envelope=envelope.model_dump(mode="json"))
    )
    return event_id
