"""The API presence row's outage record (store/fleet.py: beat), on a real database.

Only the last outage is kept, and its length shifts every heartbeat that predates its
end (store/liveness.py). A second gap soon after an outage (an event loop stalled by
the return storm) must not replace the outage's long shift with its own short one:
the nodes not heard again yet would go stale at once. It is recorded as one outage
with the first; a gap long after is an outage of its own.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from store.fleet import beat, presence

GAP_S = 0.4
MERGE_S = 30.0


async def _beat(sessions: async_sessionmaker[AsyncSession]) -> bool:
    async with sessions() as session, session.begin():
        return await beat(session, gap_s=GAP_S, merge_within_s=MERGE_S)


_REWIND = text(
    "UPDATE control_plane_presence SET"
    " down_since = coalesce(statement_timestamp() - make_interval(secs => :down_since),"
    " down_since),"
    " resumed_at = coalesce(statement_timestamp() - make_interval(secs => :resumed_at),"
    " resumed_at),"
    " last_seen_at = coalesce(statement_timestamp() - make_interval(secs => :last_seen_at),"
    " last_seen_at)"
)


async def _rewind(
    sessions: async_sessionmaker[AsyncSession],
    *,
    down_since: float | None = None,
    resumed_at: float | None = None,
    last_seen_at: float | None = None,
) -> None:
    """Move the row's timestamps to this many seconds before now (None: leave it)."""
    ago = {"down_since": down_since, "resumed_at": resumed_at, "last_seen_at": last_seen_at}
    async with sessions() as session, session.begin():
        await session.execute(_REWIND, ago)


async def _outage(sessions: async_sessionmaker[AsyncSession]) -> timedelta:
    async with sessions() as session:
        row = await presence(session)
        assert row is not None
        return row.resumed_at - row.down_since


async def test_a_gap_soon_after_an_outage_is_recorded_as_one_with_it(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    assert await _beat(sessions) is False  # the first row: no outage
    await _rewind(sessions, last_seen_at=60)
    assert await _beat(sessions) is True
    assert timedelta(seconds=59) < await _outage(sessions) < timedelta(seconds=61)

    # Back for 5 s, then silent for 2 s: within the merge window of the outage's end.
    await _rewind(sessions, down_since=67, resumed_at=7, last_seen_at=2)
    assert await _beat(sessions) is True
    assert timedelta(seconds=66) < await _outage(sessions) < timedelta(seconds=68)


async def test_a_gap_long_after_an_outage_is_an_outage_of_its_own(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    await _beat(sessions)
    await _rewind(sessions, down_since=200, resumed_at=140, last_seen_at=2)
    assert await _beat(sessions) is True
    assert timedelta(seconds=1) < await _outage(sessions) < timedelta(seconds=3)


async def test_the_first_gap_after_the_first_beat_is_an_outage_of_its_own(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """The first row's down_since and resumed_at are its creation: not an outage to
    merge with."""
    await _beat(sessions)
    await _rewind(sessions, down_since=5, resumed_at=5, last_seen_at=2)
    assert await _beat(sessions) is True
    assert timedelta(seconds=1) < await _outage(sessions) < timedelta(seconds=3)
