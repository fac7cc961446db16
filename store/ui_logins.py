"""The dashboard's login limit, for the whole control plane: MAX_FAILURES wrong operator
keys from one client address within WINDOW_S, and every login from it (even with the
right key, so a guesser cannot tell a hit) is refused with a Retry-After until the
oldest of them leaves the window.

The operator key is long and random, so this is not what keeps it secret; it keeps a
script from hammering the form and makes a guessing attempt loud. It used to be counted
in each API process's memory, so N processes allowed N times the bound. The failures are
rows now, which every process counts: a login takes its address's advisory lock for its
transaction, checks, compares the key and records the outcome before it commits, so
concurrent tries from one address, on any process, are counted one after another and
exactly MAX_FAILURES of them are compared with the key.

Bounded: each failure prunes a batch of rows older than the window (skipping rows another
login is pruning at that moment), so the table holds about one window of failures; a
successful login clears its address.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Final

from sqlalchemy import delete, func, insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from store.models import UiLoginFailure

# Five wrong keys a minute per address: enough for an operator's typos.
MAX_FAILURES: Final = 5
WINDOW_S: Final = 60.0
# Old rows one failure deletes at most: keeps up with any rate of failures, at one
# bounded statement each.
_PRUNE_BATCH: Final = 1000
# First key of the two-key advisory lock space: "dashboard login" (store/locks.py holds
# the nodes' namespace).
_NAMESPACE: Final = 0x6D66756C  # "mful"


@dataclass(frozen=True)
class LoginLimit:
    max_failures: int = MAX_FAILURES
    window_s: float = WINDOW_S

    @property
    def window(self) -> timedelta:
        return timedelta(seconds=self.window_s)


async def retry_after_s(
    session: AsyncSession, client: str, limit: LoginLimit = LoginLimit()
) -> int | None:
    """Called first in a login's transaction: takes the address's lock until it commits,
    then None (it may try; record the outcome with `failed` or `succeeded` in the same
    transaction) or the whole seconds until its oldest failure in the window expires."""
    # hashtext collisions only make two addresses wait for each other, never merge counts.
    await session.execute(select(func.pg_advisory_xact_lock(_NAMESPACE, func.hashtext(client))))
    table = UiLoginFailure
    count, oldest, now = (
        await session.execute(
            select(func.count(), func.min(table.failed_at), func.now()).where(
                table.client == client, table.failed_at > func.now() - limit.window
            )
        )
    ).one()
    if count < limit.max_failures:
        return None
    return max(1, math.ceil((oldest + limit.window - now).total_seconds()))


async def failed(session: AsyncSession, client: str, limit: LoginLimit = LoginLimit()) -> None:
    """A wrong key from this address, under the lock `retry_after_s` took."""
    table = UiLoginFailure
    await session.execute(insert(table).values(client=client, failed_at=func.now()))
    stale = (
        select(table.id)
        .where(table.failed_at <= func.now() - limit.window)
        .order_by(table.failed_at)
        .limit(_PRUNE_BATCH)
        .with_for_update(skip_locked=True)
    )
    await session.execute(delete(table).where(table.id.in_(stale.scalar_subquery())))


async def succeeded(session: AsyncSession, client: str) -> None:
    """The right key from this address: its count starts again."""
    table = UiLoginFailure
    await session.execute(delete(table).where(table.client == client))
