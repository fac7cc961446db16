"""Liveness sweep: record online -> stale -> offline transitions as their thresholds pass.
A rule of the store beside lease expiry (store/leases.py); the workers only schedule it
(workers/actors.py). Apart from store/liveness.py because it reads the fleet's safety
(store/fleet.py), which itself reads liveness.

Safe with any number of concurrent sweepers: candidate rows are claimed with
FOR UPDATE SKIP LOCKED, each node's event lock is only *tried* (a node busy with a
request is simply left for the next sweep), and the decision is re-made under the
lock from fresh state, so a transition is recorded once. Disabled and decommissioned
nodes are never touched.

Fleet safety (store/fleet.py) comes first in every sweep: with no API present nothing
is recorded (nobody could hear the heartbeats); nor while an API process shed load
within the last stale threshold (the silence may be its refusals: api/shedding.py);
and while the partition breaker holds, no node goes offline (one due offline from
online is recorded stale instead).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import and_, func, select, true
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from schemas.admin import Liveness
from store.fleet import PartitionBreaker, api_present, evaluate_partition, shedding_recently
from store.liveness import LivenessThresholds, liveness_expression, record_transition
from store.locks import node_try_xact_lock
from store.models import Node

OFFLINE = Liveness.OFFLINE.value
STALE = Liveness.STALE.value


@dataclass(frozen=True)
class Transition:
    node_id: str
    previous: str
    current: str


async def _sweep_batch(
    session: AsyncSession,
    thresholds: LivenessThresholds,
    batch_size: int,
    after: uuid.UUID | None,
    hold_offline: bool,
) -> tuple[list[uuid.UUID], list[Transition]]:
    computed = liveness_expression(thresholds)
    candidates = (
        (
            await session.execute(
                select(Node.id)
                .where(
                    and_(
                        Node.enabled.is_(True),
                        Node.decommissioned_at.is_(None),
                        Node.liveness != computed,
                        Node.id > after if after is not None else true(),
                    )
                )
                .order_by(Node.id)
                .limit(batch_size)
                .with_for_update(skip_locked=True, of=Node)
            )
        )
        .scalars()
        .all()
    )
    transitions: list[Transition] = []
    for node_id in candidates:
        if not (await session.execute(select(node_try_xact_lock(node_id)))).scalar_one():
            continue
        row = (
            await session.execute(
                select(
                    Node.liveness,
                    Node.last_heartbeat_at,
                    Node.enabled,
                    Node.decommissioned_at,
                    computed.label("computed"),
                    func.statement_timestamp().label("now"),
                ).where(Node.id == node_id)
            )
        ).one()
        current = row.computed
        if hold_offline and current == OFFLINE:
            current = STALE
        if not row.enabled or row.decommissioned_at is not None or row.liveness == current:
            continue
        await record_transition(
            session,
            node_id=node_id,
            previous=row.liveness,
            current=current,
            last_heartbeat_at=row.last_heartbeat_at,
            decided_by="sweep",
            at=row.now,
        )
        transitions.append(Transition(str(node_id), row.liveness, current))
    return list(candidates), transitions


async def sweep(
    sessions: async_sessionmaker[AsyncSession],
    thresholds: LivenessThresholds,
    *,
    breaker: PartitionBreaker | None = None,
    batch_size: int = 100,
) -> list[Transition]:
    """Record every due transition; each batch commits on its own (keyset by node id)."""
    async with sessions() as session, session.begin():
        if not await api_present(session, gap_s=thresholds.presence_gap_s):
            return []
        if await shedding_recently(session, within_s=thresholds.stale_after_s):
            # The silence may be our own refusals (api/shedding.py), not the nodes'.
            return []
        hold = await evaluate_partition(session, thresholds, breaker or PartitionBreaker())
    done: list[Transition] = []
    after: uuid.UUID | None = None
    while True:
        async with sessions() as session, session.begin():
            candidates, batch = await _sweep_batch(session, thresholds, batch_size, after, hold)
        done += batch
        if len(candidates) < batch_size:
            return done
        after = candidates[-1]
