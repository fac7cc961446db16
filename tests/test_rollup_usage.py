"""The usage rollup's write side (store/rollup/usage.py) against real PostgreSQL: several
processes' sessions adding to the same rows at once give exactly the sums (counts and
time-to-first-token buckets, element-wise), one statement for a flush whatever its keys
repeat, and a client's tokens today count from UTC midnight."""

from __future__ import annotations

import asyncio
import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from schemas.usage import TTFT_BUCKETS_S, empty_buckets, quantile_s, ttft_bucket
from store.rollup import usage
from store.rollup.tables import UsageMinute
from store.rollup.usage import UsageDelta

Key = tuple[datetime, uuid.UUID, str, str]
Sums = tuple[int, int, int, int, float, tuple[int, ...]]

WRITERS = 8
ROUNDS = 15
OUTCOMES = ("ok", "rate_limited", "upstream_failed")


async def database_now(sessions: async_sessionmaker[AsyncSession]) -> datetime:
    async with sessions() as session:
        now: datetime = (await session.execute(select(func.statement_timestamp()))).scalar_one()
    return now


def delta(minute: datetime, client: uuid.UUID, model: str, outcome: str, seed: int) -> UsageDelta:
    buckets = [0] * len(TTFT_BUCKETS_S)
    buckets[seed % len(buckets)] = seed % 3 + 1
    return UsageDelta(
        minute=minute,
        client_id=client,
        model=model,
        outcome=outcome,
        requests=seed % 5 + 1,
        prompt_tokens=seed * 7,
        completion_tokens=seed * 11,
        ttft_count=sum(buckets),
        ttft_sum_s=0.25 * sum(buckets),
        ttft_buckets=tuple(buckets),
    )


def summed(deltas: list[UsageDelta]) -> dict[Key, Sums]:
    expected: dict[Key, Sums] = {}
    for d in deltas:
        key = (d.minute.replace(second=0, microsecond=0), d.client_id, d.model, d.outcome)
        had: Sums = expected.get(key, (0, 0, 0, 0, 0.0, empty_buckets()))
        expected[key] = (
            had[0] + d.requests,
            had[1] + d.prompt_tokens,
            had[2] + d.completion_tokens,
            had[3] + d.ttft_count,
            had[4] + d.ttft_sum_s,
            tuple(a + b for a, b in zip(had[5], d.ttft_buckets, strict=True)),
        )
    return expected


async def stored(
    sessions: async_sessionmaker[AsyncSession],
) -> dict[Key, Sums]:
    async with sessions() as session:
        rows = (await session.execute(select(UsageMinute))).scalars().all()
    return {
        (r.minute, r.client_id, r.model, r.outcome): (
            r.requests,
            r.prompt_tokens,
            r.completion_tokens,
            r.ttft_count,
            r.ttft_sum_s,
            tuple(r.ttft_buckets),
        )
        for r in rows
    }


async def test_concurrent_writers_add_up_exactly(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    now = (await database_now(sessions)).astimezone(UTC)
    minutes = [now - timedelta(minutes=offset) for offset in range(2)]
    clients = [uuid.uuid4() for _ in range(3)]
    models = ("alpha", "beta")
    keys = [
        (m, c, model, o) for m in minutes for c in clients for model in models for o in OUTCOMES
    ]
    start = asyncio.Barrier(WRITERS)
    written: list[UsageDelta] = []

    async def writer(number: int) -> None:
        shuffle = random.Random(number)
        await start.wait()
        for round_ in range(ROUNDS):
            # Each flush touches most keys, in its own order, some twice.
            picked = shuffle.sample(keys, len(keys) - 3) + shuffle.sample(keys, 3)
            flush = [
                delta(m, c, model, o, seed=number * 1000 + round_ * 37 + i)
                for i, (m, c, model, o) in enumerate(picked)
            ]
            written.extend(flush)
            async with sessions() as session, session.begin():
                await usage.add(session, flush)

    await asyncio.wait_for(asyncio.gather(*(writer(n) for n in range(WRITERS))), 120)

    expected = summed(written)
    found = await stored(sessions)
    assert found.keys() == expected.keys()
    for key, want in expected.items():
        got = found[key]
        assert got[:4] == want[:4], key
        assert got[4] == pytest.approx(want[4]), key
        assert got[5] == want[5], key


async def test_a_flush_is_one_statement_and_tokens_today_start_at_utc_midnight(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    now = (await database_now(sessions)).astimezone(UTC)
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    spender, idle, other = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    flush = [
        delta(now, spender, "alpha", "ok", seed=3),
        delta(now, spender, "alpha", "ok", seed=4),  # the same key twice in one flush
        delta(midnight, spender, "beta", "budget_exhausted", seed=5),
        delta(midnight - timedelta(minutes=1), spender, "alpha", "ok", seed=6),  # yesterday
        delta(now, other, "alpha", "ok", seed=7),
    ]
    async with sessions() as session, session.begin():
        await usage.add(session, flush)
        await usage.add(session, [])
    async with sessions() as session:
        spent = await usage.tokens_today(session, [spender, idle])
        assert await usage.tokens_today(session, []) == {}
    assert spent == {spender: (3 + 4 + 5) * 18, idle: 0}
    found = await stored(sessions)
    assert found[(now.replace(second=0, microsecond=0), spender, "alpha", "ok")][0] == 4 + 5


async def test_refuses_a_bucket_array_of_another_length_and_a_naive_minute(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    now = await database_now(sessions)
    short = UsageDelta(now, uuid.uuid4(), "alpha", "ok", 1, 0, 0, 1, 0.1, (1,))
    naive = delta(now.replace(tzinfo=None), uuid.uuid4(), "alpha", "ok", seed=1)
    async with sessions() as session:
        with pytest.raises(ValueError, match="ttft_buckets"):
            await usage.add(session, [short])
        with pytest.raises(ValueError, match="timezone"):
            await usage.add(session, [naive])


@pytest.mark.fast
def test_buckets_and_quantiles() -> None:
    assert ttft_bucket(0.0) == 0
    assert ttft_bucket(TTFT_BUCKETS_S[0]) == 0  # bounds are inclusive
    assert ttft_bucket(0.03) == 1
    assert ttft_bucket(1e9) == len(TTFT_BUCKETS_S) - 1
    assert ttft_bucket(float("nan")) == len(TTFT_BUCKETS_S) - 1
    assert quantile_s(empty_buckets(), 0.5) is None
    buckets = list(empty_buckets())
    one_second = TTFT_BUCKETS_S.index(1.0)
    buckets[one_second] = 100  # all between 0.75 s and 1 s
    assert quantile_s(buckets, 0.5) == pytest.approx(0.875)
    assert quantile_s(buckets, 0.99) == pytest.approx(0.9975)
    buckets[-1] = 100  # half beyond the last bound: the p99 is "at least" that bound
    assert quantile_s(buckets, 0.99) == TTFT_BUCKETS_S[-2]
    assert quantile_s(buckets, 0.5) == pytest.approx(1.0)
