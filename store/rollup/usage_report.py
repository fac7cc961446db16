"""The read side of usage_minutes: the admin usage report (per step, client and model,
with totals) and the gateway's figures summed over every client (the overview's now
and history).

Each statement scans the range once, grouping as it goes; time-to-first-token buckets
are summed one column per bucket (ttft_buckets[i]), which costs a sum per bucket instead
of building and unnesting arrays.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from schemas.usage import (
    OUTCOME_OK,
    TTFT_BUCKETS_S,
    UsageReport,
    UsageRow,
    UsageStep,
    UsageTotals,
    quantile_s,
)

# The statements below are composed of these fixed fragments and the fixed filter
# clauses of Filters.where; every value is a bind parameter.
_BUCKETS = range(len(TTFT_BUCKETS_S))
_COUNTS = ("requests", "prompt_tokens", "completion_tokens", "ttft_count")
# Sums over usage_minutes rows, and sums of those sums.
_SUMS = ", ".join(
    [f"sum({name}) AS {name}" for name in _COUNTS]
    + [f"sum(ttft_buckets[{i + 1}]) AS b{i}" for i in _BUCKETS]
)
_RESUMS = ", ".join(
    [f"sum({name}) AS {name}" for name in _COUNTS] + [f"sum(b{i}) AS b{i}" for i in _BUCKETS]
)
_COLUMNS = ", ".join([*_COUNTS, *(f"b{i}" for i in _BUCKETS)])


@dataclass
class Summed:
    """Invokes of one group, every outcome."""

    requests: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_count: int = 0
    buckets: list[int] = field(default_factory=lambda: [0] * len(TTFT_BUCKETS_S))

    def add(self, row: Any) -> None:
        requests = int(row.requests)
        self.requests += requests
        if row.outcome != OUTCOME_OK:
            self.errors[row.outcome] = self.errors.get(row.outcome, 0) + requests
        self.prompt_tokens += int(row.prompt_tokens)
        self.completion_tokens += int(row.completion_tokens)
        self.ttft_count += int(row.ttft_count)
        for index in _BUCKETS:
            self.buckets[index] += int(getattr(row, f"b{index}") or 0)

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    def p50(self) -> float | None:
        return quantile_s(self.buckets, 0.5)

    def p99(self) -> float | None:
        return quantile_s(self.buckets, 0.99)

    def counts(self) -> dict[str, Any]:
        """The fields of schemas/usage.py: UsageCounts."""
        return {
            "requests": self.requests,
            "errors": self.errors,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "ttft_count": self.ttft_count,
            "ttft_p50_s": self.p50(),
            "ttft_p99_s": self.p99(),
        }


@dataclass(frozen=True)
class Filters:
    since: datetime
    until: datetime
    client: uuid.UUID | None = None
    model: str | None = None

    def where(self) -> tuple[str, dict[str, Any]]:
        clauses = ["minute >= :since", "minute < :until"]
        values: dict[str, Any] = {"since": self.since, "until": self.until}
        if self.client is not None:
            clauses.append("client_id = :client")
            values["client"] = self.client
        if self.model is not None:
            clauses.append("model = :model")
            values["model"] = self.model
        return " AND ".join(clauses), values


async def report(
    session: AsyncSession, filters: Filters, step: UsageStep, limit: int
) -> UsageReport:
    """Rows of (step start, client, model) in order, at most `limit`, and the totals of
    everything the filters select: one statement, one scan of the range."""
    where, values = filters.where()
    rows = await session.execute(
        text(
            f"""
            WITH grouped AS MATERIALIZED (
                SELECT date_trunc(:step, minute, 'UTC') AS start, client_id, model, outcome,
                    {_SUMS}
                FROM usage_minutes WHERE {where} GROUP BY 1, 2, 3, 4
            ), ranked AS (
                SELECT *, dense_rank() OVER (ORDER BY start, client_id, model) AS place
                FROM grouped
            )
            SELECT r.place, r.start, r.client_id, c.name AS client_name, r.model,
                r.outcome, {_COLUMNS}
            FROM ranked AS r LEFT JOIN service_clients AS c ON c.id = r.client_id
            WHERE r.place <= :limit
            UNION ALL
            SELECT NULL, NULL, NULL, NULL, NULL, outcome, {_RESUMS}
            FROM grouped GROUP BY outcome
            """  # noqa: S608
        ),
        {**values, "step": step.value, "limit": limit + 1},
    )
    grouped: dict[int, tuple[Any, Summed]] = {}
    totals = Summed()
    for row in rows.all():
        if row.place is None:
            totals.add(row)
            continue
        if row.place not in grouped:
            grouped[row.place] = (row, Summed())
        grouped[row.place][1].add(row)
    places = sorted(grouped)
    return UsageReport(
        since=filters.since,
        until=filters.until,
        step=step,
        rows=[_row(*grouped[place]) for place in places[:limit]],
        totals=UsageTotals(**totals.counts()),
        truncated=len(places) > limit,
    )


def _row(first: Any, summed: Summed) -> UsageRow:
    return UsageRow(
        start=first.start,
        client_id=first.client_id,
        client_name=first.client_name,
        model=first.model,
        **summed.counts(),
    )


async def _totals(session: AsyncSession, where: str, values: dict[str, Any]) -> Summed:
    rows = await session.execute(
        text(f"SELECT outcome, {_SUMS} FROM usage_minutes WHERE {where} GROUP BY outcome"),  # noqa: S608
        values,
    )
    total = Summed()
    for row in rows.all():
        total.add(row)
    return total


async def gateway_window(session: AsyncSession, since: datetime, until: datetime) -> Summed:
    """Every client's and model's invokes in [since, until)."""
    where, values = Filters(since, until).where()
    return await _totals(session, where, values)


async def gateway_series(
    session: AsyncSession, since: datetime, until: datetime, step_s: int
) -> dict[datetime, Summed]:
    """Every client's and model's invokes per step of [since, until), keyed by the
    step's start (aligned to the epoch); steps without invokes are absent."""
    where, values = Filters(since, until).where()
    rows = await session.execute(
        text(
            f"""
            SELECT to_timestamp(floor(extract(epoch FROM minute) / :step) * :step) AS start,
                outcome, {_SUMS}
            FROM usage_minutes WHERE {where} GROUP BY 1, 2
            """  # noqa: S608
        ),
        {**values, "step": step_s},
    )
    series: dict[datetime, Summed] = {}
    for row in rows.all():
        series.setdefault(row.start, Summed()).add(row)
    return series
