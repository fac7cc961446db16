"""Inventory and telemetry ingest: cursor, last-good state and not-applied reasons.

An accepted inventory is stored for the workers to reconcile (store/inventory.py): the
request decides ordering and answers; GPU events follow a few hundred ms later.

The server-received time of a sample is the database clock when its stream row is
locked: one statement reads the cursor and the time, whichever way the node was
authenticated (the node cache or the database, api/deps.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Table, and_, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from api.agent.auth import AuthenticatedNode
from api.agent.ordering import Decision, decide
from api.errors import Conflict
from schemas.agent import IngestResult, InventoryReport, TelemetryReport
from schemas.errors import ErrorCode
from schemas.events import EventType, StreamNotApplied, node_actor
from schemas.protocol import StreamName
from schemas.runtime_local import RuntimeReport
from store import changes, deployments, inventory, runtime
from store.models import NodeStream


@dataclass(frozen=True)
class Advanced:
    decision: Decision
    # Server-received time of the sample (database clock).
    received_at: datetime


_STREAMS: Table = NodeStream.__table__  # type: ignore[assignment]


async def _advance(
    session: AsyncSession,
    node: AuthenticatedNode,
    stream_name: str,
    report: InventoryReport | TelemetryReport | RuntimeReport,
    good_payload: dict[str, Any],
    future_skew_limit_s: float,
) -> Advanced:
    # Two plain statements (Core, not an ORM object and a flush: this runs for every
    # telemetry sample of the fleet). The row lock serialises samples of one stream;
    # other nodes never wait on it.
    here = and_(_STREAMS.c.node_id == node.node_id, _STREAMS.c.stream == stream_name)
    stream = (
        await session.execute(
            select(
                _STREAMS.c.cursor,
                _STREAMS.c.good_observed_at,
                _STREAMS.c.not_applied_reason,
                func.statement_timestamp().label("now"),
            )
            .where(here)
            .with_for_update()
        )
    ).one()
    received_at: datetime = stream.now
    decision = decide(
        cursor=stream.cursor,
        good_observed_at=stream.good_observed_at,
        sequence=report.sequence,
        observed_at=report.observed_at,
        received_at=received_at,
        future_skew_limit=timedelta(seconds=future_skew_limit_s),
    )
    if decision.replay:
        raise Conflict(
            f"{stream_name} sequence {report.sequence} was already received",
            code=ErrorCode.SEQUENCE_REPLAYED,
            extra={"stream": stream_name, "cursor": stream.cursor},
        )
    values: dict[str, Any] = {"cursor": report.sequence}
    if decision.applied:
        values |= {
            "good_sequence": report.sequence,
            "good_observed_at": report.observed_at,
            "good_received_at": received_at,
            "good_payload": good_payload,
            "not_applied_reason": None,
            "not_applied_sequence": None,
            "not_applied_observed_at": None,
            "not_applied_received_at": None,
        }
    else:
        assert decision.reason is not None
        if stream.not_applied_reason != decision.reason:
            # Once per episode, not per refused sample: a skewed clock must not flood
            # the stream.
            changes.record(
                session,
                EventType.NODE_STREAM_NOT_APPLIED,
                StreamNotApplied(
                    node_id=node.node_id,
                    stream=stream_name,
                    sequence=report.sequence,
                    reason=decision.reason.value,
                    observed_at=report.observed_at,
                    received_at=received_at,
                ),
                actor=node_actor(node.node_id),
            )
        values |= {
            "not_applied_reason": decision.reason.value,
            "not_applied_sequence": report.sequence,
            "not_applied_observed_at": report.observed_at,
            "not_applied_received_at": received_at,
        }
    await session.execute(update(_STREAMS).where(here).values(**values))
    return Advanced(decision, received_at)


def _result(
    node: AuthenticatedNode, stream: str, sequence: int, advanced: Advanced
) -> IngestResult:
    return IngestResult(
        node_id=node.node_id,
        stream=stream,
        sequence=sequence,
        applied=advanced.decision.applied,
        reason=advanced.decision.reason,
        received_at=advanced.received_at,
    )


async def ingest_inventory(
    session: AsyncSession,
    node: AuthenticatedNode,
    report: InventoryReport,
    *,
    future_skew_limit_s: float,
) -> IngestResult:
    node.require_owns(report.node_id)
    payload = report.model_dump(mode="json", include={"complete", "host"})
    stream = StreamName.INVENTORY
    advanced = await _advance(session, node, stream, report, payload, future_skew_limit_s)
    if advanced.decision.applied:
        inventory.accept(session, node.node_id, report, advanced.received_at)
    return _result(node, stream, report.sequence, advanced)


async def ingest_telemetry(
    session: AsyncSession,
    node: AuthenticatedNode,
    report: TelemetryReport,
    *,
    future_skew_limit_s: float,
) -> IngestResult:
    node.require_owns(report.node_id)
    payload = report.model_dump(mode="json", exclude={"node_id", "sequence", "observed_at"})
    stream = StreamName.TELEMETRY
    advanced = await _advance(session, node, stream, report, payload, future_skew_limit_s)
    return _result(node, stream, report.sequence, advanced)


async def ingest_runtime(
    session: AsyncSession,
    node: AuthenticatedNode,
    report: RuntimeReport,
    *,
    future_skew_limit_s: float,
) -> IngestResult:
    """The runtime worker's report: a stream of its own with inventory's ordering."""
    node.require_owns(report.node_id)
    payload = report.model_dump(mode="json", exclude={"node_id", "sequence", "observed_at"})
    stream = StreamName.RUNTIME
    advanced = await _advance(session, node, stream, report, payload, future_skew_limit_s)
    if advanced.decision.applied:
        await runtime.record_environments(session, node.node_id, report, advanced.received_at)
        await deployments.record_reported(session, node.node_id, payload)
    return _result(node, stream, report.sequence, advanced)
