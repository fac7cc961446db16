"""The gateway's own measurements per served model (migration 0018), what autoscale
reads (store/services/reconcile.py).

Each API process keeps a small window per model it relayed invokes of (api/gateway/
measurements.py) and writes it here every few seconds, one row per (model, process),
overwritten each time: the invokes in flight now (relayed, on any replica), those
started and failed in the window, and the time to first token of its recent streams
(p50, p90 and how many samples they come from). Several API processes add up: the
read side sums their rows.

A row's `window_end` is the database's clock when it was written. A process that dies
stops writing, so the read side counts only rows younger than a staleness bound, and
old rows are pruned (by the writers: any live API process, see `prune`). A process
that stops cleanly deletes its own rows (`forget`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Float, Integer, String, delete, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Mapped, mapped_column

from store.models import Base

# The read side's bound: a row older than this is a process that stopped writing (the
# writers flush every few seconds, at most 10: api/settings.py gateway_measure_interval_s).
FRESH_S = 30.0
# Rows older than this are deleted by the writers.
PRUNE_AFTER_S = 600.0


class GatewayMeasurement(Base):
    """One API process's last window for one served model."""

    __tablename__ = "gateway_measurements"

    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    # The API process (its gateway id: api/gateway/relay.py InvokeRelay.id).
    instance: Mapped[str] = mapped_column(String(64), primary_key=True)
    window_end: Mapped[datetime]
    window_s: Mapped[float] = mapped_column(Float)
    in_flight: Mapped[int] = mapped_column(Integer)
    started: Mapped[int] = mapped_column(Integer)
    errors: Mapped[int] = mapped_column(Integer)
    ttft_count: Mapped[int] = mapped_column(Integer)
    ttft_p50_s: Mapped[float | None] = mapped_column(Float)
    ttft_p90_s: Mapped[float | None] = mapped_column(Float)


@dataclass(frozen=True)
class Window:
    """What one API process measured of one model since its last write."""

    model: str
    window_s: float
    in_flight: int
    started: int
    errors: int
    ttft_count: int
    ttft_p50_s: float | None
    ttft_p90_s: float | None


@dataclass(frozen=True)
class Measured:
    """A model's measurements across the API processes that wrote lately."""

    rows: int
    in_flight: int
    started: int
    errors: int
    ttft_count: int
    # The processes' p90s weighted by their samples: a p90 of the merged samples cannot
    # be had from p90s; with traffic spread over the processes they are alike anyway.
    ttft_p90_s: float | None


async def write(session: AsyncSession, instance: str, windows: Sequence[Window]) -> None:
    """One statement for all of a process's windows: each (model, instance) row
    inserted or overwritten, its end the database's clock."""
    if not windows:
        return
    rows = [
        {
            "model": w.model,
            "instance": instance,
            "window_end": func.statement_timestamp(),
            "window_s": w.window_s,
            "in_flight": w.in_flight,
            "started": w.started,
            "errors": w.errors,
            "ttft_count": w.ttft_count,
            "ttft_p50_s": w.ttft_p50_s,
            "ttft_p90_s": w.ttft_p90_s,
        }
        for w in windows
    ]
    statement = insert(GatewayMeasurement).values(rows)
    columns = ("window_end", "window_s", "in_flight", "started", "errors", "ttft_count",
               "ttft_p50_s", "ttft_p90_s")  # fmt: skip
    await session.execute(
        statement.on_conflict_do_update(
            index_elements=[GatewayMeasurement.model, GatewayMeasurement.instance],
            set_={column: statement.excluded[column] for column in columns},
        )
    )


async def read(session: AsyncSession, model: str, *, fresh_s: float = FRESH_S) -> Measured:
    """The sum over the rows written within `fresh_s` (database clock)."""
    since = func.statement_timestamp() - timedelta(seconds=fresh_s)
    found = await session.execute(
        select(GatewayMeasurement).where(
            GatewayMeasurement.model == model, GatewayMeasurement.window_end > since
        )
    )
    rows = list(found.scalars().all())
    timed = [r for r in rows if r.ttft_p90_s is not None and r.ttft_count > 0]
    samples = sum(r.ttft_count for r in timed)
    p90 = (
        sum(r.ttft_p90_s * r.ttft_count for r in timed if r.ttft_p90_s is not None) / samples
        if samples
        else None
    )
    return Measured(
        rows=len(rows),
        in_flight=sum(r.in_flight for r in rows),
        started=sum(r.started for r in rows),
        errors=sum(r.errors for r in rows),
        ttft_count=samples,
        ttft_p90_s=p90,
    )


async def prune(session: AsyncSession, *, older_than_s: float = PRUNE_AFTER_S) -> int:
    """Delete the rows of processes that stopped writing long ago; how many."""
    since = func.statement_timestamp() - timedelta(seconds=older_than_s)
    done = await session.execute(
        delete(GatewayMeasurement).where(GatewayMeasurement.window_end < since)
    )
    return int(done.rowcount or 0)  # type: ignore[attr-defined]


async def forget(session: AsyncSession, instance: str) -> None:
    """A process that stops cleanly: its rows no longer count."""
    await session.execute(delete(GatewayMeasurement).where(GatewayMeasurement.instance == instance))
