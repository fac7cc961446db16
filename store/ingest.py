"""Inventory, telemetry and runtime ingest: cursor, last-good state and not-applied
reasons, each sample decided by the ordering rules (store/ordering.py: decide) through
one pure step (`step`) that the single sample and the batch share.

An accepted inventory is stored for the workers to reconcile (store/inventory.py): the
request decides ordering and answers; GPU events follow a few hundred ms later. A
replay is refused as a Conflict (409, sequence_replayed).

The server-received time of a sample is the database clock when its stream row is
locked: one statement reads the cursor and the time, whichever way the node was
authenticated (the node cache or the database, api/deps.py). The API's routes call
these (api/agent/routes.py), and a cached node's telemetry joins
a batch (api/telemetry_batch.py: ingest_telemetry_batch here).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Table, and_, bindparam, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from schemas.agent import IngestResult, InventoryReport, TelemetryReport
from schemas.errors import ErrorCode
from schemas.events import EventType, StreamNotApplied, node_actor
from schemas.protocol import StreamName
from schemas.runtime_local import RuntimeReport
from store import changes, inventory, runtime
from store.deployments import rules as deployments
from store.errors import Conflict
from store.models import NodeStream
from store.node_credentials import AuthenticatedNode
from store.ordering import Decision, decide


@dataclass(frozen=True)
class Advanced:
    decision: Decision
    # Server-received time of the sample (database clock).
    received_at: datetime


_STREAMS: Table = NodeStream.__table__  # type: ignore[assignment]


@dataclass(frozen=True)
class StreamState:
    """What the ordering rules read of a stream row."""

    cursor: int
    good_observed_at: datetime | None
    not_applied_reason: str | None


@dataclass(frozen=True)
class Step:
    """One sample decided against a stream's state: the columns it sets (none for a
    replay), the event it starts (a not-applied episode), and the state it leaves."""

    decision: Decision
    values: dict[str, Any]
    event: StreamNotApplied | None
    after: StreamState


def step(
    state: StreamState,
    node_id: uuid.UUID,
    stream_name: str,
    report: InventoryReport | TelemetryReport | RuntimeReport,
    good_payload: dict[str, Any],
    received_at: datetime,
    future_skew_limit_s: float,
) -> Step:
    decision = decide(
        cursor=state.cursor,
        good_observed_at=state.good_observed_at,
        sequence=report.sequence,
        observed_at=report.observed_at,
        received_at=received_at,
        future_skew_limit=timedelta(seconds=future_skew_limit_s),
    )
    if decision.replay:
        return Step(decision, {}, None, state)
    values: dict[str, Any] = {"cursor": report.sequence}
    event = None
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
        after = StreamState(report.sequence, report.observed_at, None)
    else:
        assert decision.reason is not None
        if state.not_applied_reason != decision.reason:
            # Once per episode, not per refused sample: a skewed clock must not flood
            # the stream.
            event = StreamNotApplied(
                node_id=node_id,
                stream=stream_name,
                sequence=report.sequence,
                reason=decision.reason.value,
                observed_at=report.observed_at,
                received_at=received_at,
            )
        values |= {
            "not_applied_reason": decision.reason.value,
            "not_applied_sequence": report.sequence,
            "not_applied_observed_at": report.observed_at,
            "not_applied_received_at": received_at,
        }
        after = StreamState(report.sequence, state.good_observed_at, decision.reason.value)
    return Step(decision, values, event, after)


def _replayed(stream_name: str, sequence: int, cursor: int) -> Conflict:
    return Conflict(
        f"{stream_name} sequence {sequence} was already received",
        code=ErrorCode.SEQUENCE_REPLAYED,
        extra={"stream": stream_name, "cursor": cursor},
    )


def _record(session: AsyncSession, node_id: uuid.UUID, event: StreamNotApplied | None) -> None:
    if event is not None:
        changes.record(session, EventType.NODE_STREAM_NOT_APPLIED, event, actor=node_actor(node_id))


_STATE_COLUMNS = (
    _STREAMS.c.cursor,
    _STREAMS.c.good_observed_at,
    _STREAMS.c.not_applied_reason,
    func.statement_timestamp().label("now"),
)


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
    row = (await session.execute(select(*_STATE_COLUMNS).where(here).with_for_update())).one()
    received_at: datetime = row.now
    state = StreamState(row.cursor, row.good_observed_at, row.not_applied_reason)
    taken = step(
        state, node.node_id, stream_name, report, good_payload, received_at, future_skew_limit_s
    )
    if taken.decision.replay:
        raise _replayed(stream_name, report.sequence, state.cursor)
    _record(session, node.node_id, taken.event)
    await session.execute(update(_STREAMS).where(here).values(**taken.values))
    return Advanced(taken.decision, received_at)


def _result(
    node_id: uuid.UUID, stream: str, sequence: int, decision: Decision, received_at: datetime
) -> IngestResult:
    return IngestResult(
        node_id=node_id,
        stream=stream,
        sequence=sequence,
        applied=decision.applied,
        reason=decision.reason,
        received_at=received_at,
    )


def _advanced(
    node: AuthenticatedNode, stream: str, sequence: int, advanced: Advanced
) -> IngestResult:
    return _result(node.node_id, stream, sequence, advanced.decision, advanced.received_at)


def _last_good(report: TelemetryReport | RuntimeReport) -> dict[str, Any]:
    """What a telemetry or runtime sample leaves as the stream's last-good state: the
    sample without its envelope."""
    return report.model_dump(mode="json", exclude={"node_id", "sequence", "observed_at"})


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
    return _advanced(node, stream, report.sequence, advanced)


async def ingest_telemetry(
    session: AsyncSession,
    node: AuthenticatedNode,
    report: TelemetryReport,
    *,
    future_skew_limit_s: float,
) -> IngestResult:
    node.require_owns(report.node_id)
    payload = _last_good(report)
    stream = StreamName.TELEMETRY
    advanced = await _advance(session, node, stream, report, payload, future_skew_limit_s)
    return _advanced(node, stream, report.sequence, advanced)


@dataclass(frozen=True)
class Sample:
    """A cached node's telemetry sample waiting for its batch (api/telemetry_batch.py)."""

    node_id: uuid.UUID
    report: TelemetryReport


async def ingest_telemetry_batch(
    session: AsyncSession, samples: Sequence[Sample], *, future_skew_limit_s: float
) -> list[IngestResult | Conflict]:
    """Many nodes' telemetry in one transaction, each sample decided by `step` in arrival
    order against its stream as the samples before it left it: the outcome of each, in
    order (a replay is its Conflict). The rows are locked in node order, so a batch and
    a single sample, or two batches of two API processes, never deadlock; one UPDATE per
    shape of change for the whole batch."""
    stream_name = StreamName.TELEMETRY
    ids = sorted({sample.node_id for sample in samples})
    rows = (
        await session.execute(
            select(_STREAMS.c.node_id, *_STATE_COLUMNS)
            .where(_STREAMS.c.stream == stream_name, _STREAMS.c.node_id.in_(ids))
            .order_by(_STREAMS.c.node_id)
            .with_for_update()
        )
    ).all()
    states = {
        row.node_id: StreamState(row.cursor, row.good_observed_at, row.not_applied_reason)
        for row in rows
    }
    missing = [node_id for node_id in ids if node_id not in states]
    if missing:
        raise LookupError(f"nodes without a {stream_name} stream: {missing}")
    received_at: datetime = rows[0].now
    finals: dict[uuid.UUID, dict[str, Any]] = {}
    outcomes: list[IngestResult | Conflict] = []
    for sample in samples:
        state = states[sample.node_id]
        report = sample.report
        taken = step(
            state,
            sample.node_id,
            stream_name,
            report,
            _last_good(report),
            received_at,
            future_skew_limit_s,
        )
        if taken.decision.replay:
            outcomes.append(_replayed(stream_name, report.sequence, state.cursor))
            continue
        _record(session, sample.node_id, taken.event)
        finals.setdefault(sample.node_id, {}).update(taken.values)
        states[sample.node_id] = taken.after
        outcomes.append(
            _result(sample.node_id, stream_name, report.sequence, taken.decision, received_at)
        )
    by_shape: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for node_id, values in finals.items():
        by_shape.setdefault(tuple(sorted(values)), []).append({"b_node_id": node_id, **values})
    for columns, params in by_shape.items():
        statement = (
            update(_STREAMS)
            .where(_STREAMS.c.node_id == bindparam("b_node_id"), _STREAMS.c.stream == stream_name)
            .values({column: bindparam(column) for column in columns})
        )
        await session.execute(statement, params)
    return outcomes


async def ingest_runtime(
    session: AsyncSession,
    node: AuthenticatedNode,
    report: RuntimeReport,
    *,
    future_skew_limit_s: float,
) -> IngestResult:
    """The runtime worker's report: a stream of its own with inventory's ordering."""
    node.require_owns(report.node_id)
    payload = _last_good(report)
    stream = StreamName.RUNTIME
    advanced = await _advance(session, node, stream, report, payload, future_skew_limit_s)
    if advanced.decision.applied:
        await runtime.record_environments(session, node.node_id, report, advanced.received_at)
        await deployments.record_reported(session, node.node_id, payload)
    return _advanced(node, stream, report.sequence, advanced)
