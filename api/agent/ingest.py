"""Inventory and telemetry ingest: cursor, last-good state and not-applied reasons.

An accepted inventory is stored for the workers to reconcile (store/inventory.py): the
request decides ordering and answers; GPU events follow a few hundred ms later.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from api.agent.auth import AuthenticatedNode
from api.agent.ordering import Decision, decide
from api.errors import Conflict
from schemas.agent import IngestResult, InventoryReport, TelemetryReport
from schemas.errors import ErrorCode
from schemas.events import EventType, StreamNotApplied, node_actor
from store import changes, inventory
from store.models import NodeStream


async def _advance(
    session: AsyncSession,
    node: AuthenticatedNode,
    stream_name: str,
    report: InventoryReport | TelemetryReport,
    good_payload: dict[str, Any],
    future_skew_limit_s: float,
) -> tuple[NodeStream, Decision]:
    # The row lock serialises samples of one stream; other nodes never wait on it.
    stream = (
        await session.execute(
            select(NodeStream)
            .where(NodeStream.node_id == node.node_id, NodeStream.stream == stream_name)
            .with_for_update()
        )
    ).scalar_one()
    decision = decide(
        cursor=stream.cursor,
        good_observed_at=stream.good_observed_at,
        sequence=report.sequence,
        observed_at=report.observed_at,
        received_at=node.received_at,
        future_skew_limit=timedelta(seconds=future_skew_limit_s),
    )
    if decision.replay:
        raise Conflict(
            f"{stream_name} sequence {report.sequence} was already received",
            code=ErrorCode.SEQUENCE_REPLAYED,
            extra={"stream": stream_name, "cursor": stream.cursor},
        )
    stream.cursor = report.sequence
    if decision.applied:
        stream.good_sequence = report.sequence
        stream.good_observed_at = report.observed_at
        stream.good_received_at = node.received_at
        stream.good_payload = good_payload
        stream.not_applied_reason = None
        stream.not_applied_sequence = None
        stream.not_applied_observed_at = None
        stream.not_applied_received_at = None
        return stream, decision
    assert decision.reason is not None
    if stream.not_applied_reason != decision.reason:
        # Once per episode, not per refused sample: a skewed clock must not flood the stream.
        changes.record(
            session,
            EventType.NODE_STREAM_NOT_APPLIED,
            StreamNotApplied(
                node_id=node.node_id,
                stream=stream_name,
                sequence=report.sequence,
                reason=decision.reason.value,
                observed_at=report.observed_at,
                received_at=node.received_at,
            ),
            actor=node_actor(node.node_id),
        )
    stream.not_applied_reason = decision.reason.value
    stream.not_applied_sequence = report.sequence
    stream.not_applied_observed_at = report.observed_at
    stream.not_applied_received_at = node.received_at
    return stream, decision


def _result(
    node: AuthenticatedNode, stream: str, sequence: int, decision: Decision
) -> IngestResult:
    return IngestResult(
        node_id=node.node_id,
        stream=stream,
        sequence=sequence,
        applied=decision.applied,
        reason=decision.reason,
        received_at=node.received_at,
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
    _, decision = await _advance(session, node, "inventory", report, payload, future_skew_limit_s)
    if decision.applied:
        inventory.accept(session, node.node_id, report, node.received_at)
    return _result(node, "inventory", report.sequence, decision)


async def ingest_telemetry(
    session: AsyncSession,
    node: AuthenticatedNode,
    report: TelemetryReport,
    *,
    future_skew_limit_s: float,
) -> IngestResult:
    node.require_owns(report.node_id)
    payload = report.model_dump(mode="json", exclude={"node_id", "sequence", "observed_at"})
    _, decision = await _advance(session, node, "telemetry", report, payload, future_skew_limit_s)
    return _result(node, "telemetry", report.sequence, decision)
