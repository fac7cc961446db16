"""The one call that records a state change: its CloudEvent, in the caller's transaction.

The caller has applied the change to its rows; `record` writes the event that describes
it to the transactional outbox, so both commit or neither does. That event is the only
record of what happened: the relay publishes it (workers/relay.py), and the audit log is
written from the stream by workers/audit.py. Nothing on the request path writes audit
rows, so a rolled-back change leaves no trace anywhere.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncSession

from schemas.base import WireModel
from schemas.events import EVENT_PAYLOADS, SUBJECT_IDS, TARGET_TYPES, CloudEvent, EventType
from store.correlation import current_correlation_id
from store.models import OutboxEvent


@dataclass(frozen=True)
class Target:
    """What the change is about, when it is not the object the subject names (a GPU)."""

    type: str
    id: str


def record(
    session: AsyncSession,
    event_type: EventType,
    payload: WireModel,
    *,
    actor: str,
    target: Target | None = None,
    correlation_id: str | None = None,
) -> uuid.UUID:
    """Write the event of a change; returns its id.

    The subject's id (node, token, incident) comes from the payload's own field for that
    kind (schemas.events.SUBJECT_IDS); the target defaults to that object. The
    correlation id is the current request's or message's unless given (a worker that
    applies a node's report passes the report's).
    """
    expected = EVENT_PAYLOADS[event_type]
    if not isinstance(payload, expected):
        raise TypeError(f"{event_type} carries {expected.__name__}, got {type(payload).__name__}")
    kind = event_type.value.partition(".")[0]
    subject_id = getattr(payload, SUBJECT_IDS[kind])
    node_id = getattr(payload, "node_id", None)
    target = target or Target(TARGET_TYPES[kind], str(subject_id))
    event_id = uuid.uuid4()
    subject = event_type.subject(subject_id)
    envelope = CloudEvent(
        id=event_id,
        type=event_type.cloudevent_type,
        subject=subject,
        time=datetime.now(UTC),
        correlationid=correlation_id or current_correlation_id(),
        nodeid=node_id,
        actor=actor,
        action=event_type.value,
        targettype=target.type,
        targetid=target.id,
        data=payload.model_dump(mode="json"),
    )
    session.add(
        OutboxEvent(id=event_id, subject=subject, envelope=envelope.model_dump(mode="json"))
    )
    return event_id
