"""The gateway's usage per (minute, service client, served model, outcome): what every
API process adds (`add`, one statement per flush of its in-process counts: api/gateway/
usage.py), what budgets read (`tokens_today`) and what the admin usage route reads
(store/rollup/usage_report.py).

Counts are additive: any number of processes add to the same row and the totals are
exact (the upsert adds under the row's lock). Time to first token is counts per bucket
of schemas/usage.py: TTFT_BUCKETS_S, added element-wise.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from schemas.usage import TTFT_BUCKETS_S
from store.rollup.tables import UsageMinute

_ADDED = ("requests", "prompt_tokens", "completion_tokens", "ttft_count", "ttft_sum_s")


@dataclass(frozen=True)
class UsageDelta:
    """What one process counted of one (minute, client, model, outcome) since its last
    flush. `minute` is truncated to its minute (UTC) when added."""

    minute: datetime
    client_id: uuid.UUID
    model: str
    outcome: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    ttft_count: int
    ttft_sum_s: float
    ttft_buckets: tuple[int, ...]


def _minute(at: datetime) -> datetime:
    if at.tzinfo is None:
        raise ValueError("a usage minute must carry a timezone")
    return at.astimezone(UTC).replace(second=0, microsecond=0)


_Key = tuple[datetime, uuid.UUID, str, str]


def _merged(deltas: Sequence[UsageDelta]) -> dict[_Key, dict[str, object]]:
    """One row per key (one INSERT ... ON CONFLICT may not touch a row twice), its
    columns' values."""
    rows: dict[_Key, UsageDelta] = {}
    for delta in deltas:
        if len(delta.ttft_buckets) != len(TTFT_BUCKETS_S):
            raise ValueError(
                f"ttft_buckets has {len(delta.ttft_buckets)} counts, not {len(TTFT_BUCKETS_S)}"
            )
        key = (_minute(delta.minute), delta.client_id, delta.model, delta.outcome)
        found = rows.get(key)
        rows[key] = delta if found is None else _sum(found, delta)
    return {
        key: {
            "minute": key[0],
            "client_id": key[1],
            "model": key[2],
            "outcome": key[3],
            **{column: getattr(delta, column) for column in _ADDED},
            "ttft_buckets": list(delta.ttft_buckets),
        }
        for key, delta in rows.items()
    }


def _sum(one: UsageDelta, other: UsageDelta) -> UsageDelta:
    return UsageDelta(
        minute=one.minute,
        client_id=one.client_id,
        model=one.model,
        outcome=one.outcome,
        requests=one.requests + other.requests,
        prompt_tokens=one.prompt_tokens + other.prompt_tokens,
        completion_tokens=one.completion_tokens + other.completion_tokens,
        ttft_count=one.ttft_count + other.ttft_count,
        ttft_sum_s=one.ttft_sum_s + other.ttft_sum_s,
        ttft_buckets=tuple(
            a + b for a, b in zip(one.ttft_buckets, other.ttft_buckets, strict=True)
        ),
    )


# The rows travel as one JSON array, so the statement's text is one constant, compiled
# and planned once: an INSERT of N VALUES rows is compiled anew on every flush, on the
# API's event loop (about 100 ms for 300 rows; ops/bench/usage.py).
_ADD = text(
    "INSERT INTO usage_minutes AS u (minute, client_id, model, outcome, requests,"
    " prompt_tokens, completion_tokens, ttft_count, ttft_sum_s, ttft_buckets)"
    " SELECT minute, client_id, model, outcome, requests, prompt_tokens, completion_tokens,"
    " ttft_count, ttft_sum_s, ttft_buckets"
    " FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(minute timestamptz, client_id uuid,"
    " model text, outcome text, requests bigint, prompt_tokens bigint,"
    " completion_tokens bigint, ttft_count bigint, ttft_sum_s double precision,"
    " ttft_buckets bigint[])"
    " ORDER BY minute, client_id, model, outcome"
    " ON CONFLICT (minute, client_id, model, outcome) DO UPDATE SET"
    " requests = u.requests + excluded.requests,"
    " prompt_tokens = u.prompt_tokens + excluded.prompt_tokens,"
    " completion_tokens = u.completion_tokens + excluded.completion_tokens,"
    " ttft_count = u.ttft_count + excluded.ttft_count,"
    " ttft_sum_s = u.ttft_sum_s + excluded.ttft_sum_s,"
    " ttft_buckets = ARRAY(SELECT coalesce(a, 0) + coalesce(b, 0)"
    " FROM unnest(u.ttft_buckets, excluded.ttft_buckets) WITH ORDINALITY AS t(a, b, i)"
    " ORDER BY i)"
)


async def add(session: AsyncSession, deltas: Sequence[UsageDelta]) -> None:
    """Add the deltas to their rows: one statement, inserting the rows that are new.
    The rows are written in key order, so two processes adding overlapping keys wait for
    each other instead of deadlocking."""
    rows = _merged(deltas)
    if not rows:
        return
    payload = [
        {**row, "minute": key[0].isoformat(), "client_id": str(key[1])} for key, row in rows.items()
    ]
    await session.execute(_ADD, {"rows": json.dumps(payload)})


async def tokens_today(
    session: AsyncSession, client_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, int]:
    """Prompt and completion tokens of each client since UTC midnight (the database's
    clock), every outcome counted; 0 for a client without usage today."""
    if not client_ids:
        return {}
    midnight = func.date_trunc("day", func.statement_timestamp(), "UTC")
    found = await session.execute(
        select(
            UsageMinute.client_id,
            func.sum(UsageMinute.prompt_tokens + UsageMinute.completion_tokens),
        )
        .where(UsageMinute.client_id.in_(list(client_ids)), UsageMinute.minute >= midnight)
        .group_by(UsageMinute.client_id)
    )
    spent = {client_id: 0 for client_id in client_ids}
    for client_id, tokens in found.all():
        spent[client_id] = int(tokens or 0)
    return spent
