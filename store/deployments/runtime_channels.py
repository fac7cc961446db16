"""Whether a node's runtime worker holds its channel, kept where every worker can read it.

Only the API process holding a runtime channel (api/agent/runtime_channel.py) knows at
once that it ended (the gateway learns it from a delivery nobody takes); the admin API,
the CLI and the dashboard read the deployment's state, which the reconciler in the
workers decides (store/deployments/reconcile.py). So the holder writes what it knows to
one row per node: when the channel opened and until when it counts as held. Each
keep-alive moves that on by the keep-alive plus a grace; the channel's end brings it to
the grace from now (the time a runtime worker takes to come back when only its
connection moved: an API restart, a balancer); an API process that died writes nothing
more, and the row simply expires one keep-alive plus the grace after its last write.
All times are the database's (statement_timestamp), like liveness (store/liveness.py).

A node with no row never held a channel (the tests that speak for a runtime worker over
plain requests, an older runtime worker): nothing is concluded from it.
"""

from __future__ import annotations

import uuid
from typing import Final

from sqlalchemy import ColumnElement, and_, case, false, func, or_, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from store.deployments.tables import RuntimeChannel
from store.liveness import API, seconds
from store.models import ControlPlanePresence

# A runtime worker whose channel ended is taken for gone this long after: its channel
# tries again 0.5 s, 1.5 s, 3.5 s and 7.5 s after a break (agent/jobs/wakeups.py:
# hold_events), so an API process that restarts within a few seconds is no loss.
GRACE_S: Final = 10.0


def _expires(hold_s: float) -> ColumnElement[object]:
    return func.statement_timestamp() + seconds(hold_s)


async def held(
    session: AsyncSession,
    node_id: uuid.UUID,
    channel_id: uuid.UUID,
    keepalive_s: float,
    *,
    opened: bool,
) -> None:
    """The channel is held for (at least) one more keep-alive. A channel that just
    `opened` is the node's newest and takes the row over; a keep-alive refreshes its
    own row, or one whose channel ended (never a newer channel's)."""
    now = func.statement_timestamp()
    row = insert(RuntimeChannel).values(
        node_id=node_id,
        channel_id=channel_id,
        opened_at=now,
        expires_at=_expires(keepalive_s + GRACE_S),
        closed_at=None,
    )
    taken = RuntimeChannel.__table__.c
    own = taken.channel_id == row.excluded.channel_id
    update_only = None if opened else or_(own, taken.closed_at.is_not(None), taken.expires_at < now)
    await session.execute(
        row.on_conflict_do_update(
            index_elements=[RuntimeChannel.node_id],
            set_={
                "channel_id": row.excluded.channel_id,
                # Opened when this channel opened, however often it was kept alive.
                "opened_at": case((own, taken.opened_at), else_=row.excluded.opened_at),
                "expires_at": row.excluded.expires_at,
                "closed_at": None,
            },
            where=update_only,
        )
    )


async def ended(session: AsyncSession, node_id: uuid.UUID, channel_id: uuid.UUID) -> None:
    """The channel ended: unless a newer one took the row over, the node's runtime
    worker counts as gone once the grace has passed."""
    await session.execute(
        update(RuntimeChannel)
        .where(
            RuntimeChannel.node_id == node_id,
            RuntimeChannel.channel_id == channel_id,
            RuntimeChannel.closed_at.is_(None),
        )
        .values(
            closed_at=func.statement_timestamp(),
            expires_at=func.least(RuntimeChannel.expires_at, _expires(GRACE_S)),
        )
    )


async def gone(
    session: AsyncSession, node_id: uuid.UUID, *, presence_gap_s: float, restart_grace_s: float
) -> bool:
    """Whether the node held a runtime channel that is gone now (no row: never held).

    Silence counts only while the control plane could hear it, as for liveness
    (store/liveness.py: effective_heartbeat): not while no API is present, and a channel
    that lapsed before the last API outage ended (every API was down: none could hold
    it) is given the restart grace from that end to come back."""
    p = ControlPlanePresence
    now = func.statement_timestamp()
    outage = select().where(p.component == API, p.resumed_at > p.down_since)
    resumed = outage.add_columns(p.resumed_at).scalar_subquery()
    lapses = case(
        (RuntimeChannel.expires_at < resumed, resumed + seconds(restart_grace_s)),
        else_=RuntimeChannel.expires_at,
    )
    absent = (
        select(p.last_seen_at < now - seconds(presence_gap_s))
        .where(p.component == API)
        .scalar_subquery()
    )
    row = await session.execute(
        select(and_(lapses < now, func.coalesce(absent, false()).is_(False))).where(
            RuntimeChannel.node_id == node_id
        )
    )
    return bool(row.scalar_one_or_none())
