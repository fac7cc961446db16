"""Steps shared by the tests of the gateway's usage and budgets (tests/test_gateway_
usage.py, tests/test_gateway_budget.py): an API that flushes its usage often, a plain
call through the gateway, and usage_minutes as PostgreSQL holds it."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from store.rollup.tables import UsageMinute
from tests.api_server import ApiFactory, RunningApi
from tests.measurement_flows import until
from tests.test_gateway_relay import CHAT, call

__all__ = ["CHAT", "INTERVAL_S", "call", "gateway", "rows_reach", "usage_rows"]

INTERVAL_S = 0.2

Rows = dict[tuple[str, str, str], tuple[int, int, int, int]]


def gateway(api_factory: ApiFactory) -> RunningApi:
    return api_factory(
        gateway_first_token_timeout_s=10,
        gateway_token_gap_timeout_s=10,
        gateway_measure_interval_s=INTERVAL_S,
        # A node lost is not cooled down: the test's next invoke goes to it again.
        gateway_cooldown_s=0,
    )


async def usage_rows(sessions: async_sessionmaker[AsyncSession]) -> Rows:
    """(client id, model, outcome) -> requests, prompt, completion tokens, TTFT count."""
    async with sessions() as session:
        found = await session.execute(
            select(
                UsageMinute.client_id,
                UsageMinute.model,
                UsageMinute.outcome,
                func.sum(UsageMinute.requests),
                func.sum(UsageMinute.prompt_tokens),
                func.sum(UsageMinute.completion_tokens),
                func.sum(UsageMinute.ttft_count),
            ).group_by(UsageMinute.client_id, UsageMinute.model, UsageMinute.outcome)
        )
        return {
            (str(c), m, o): (int(r), int(p), int(t), int(f)) for c, m, o, r, p, t, f in found.all()
        }


async def rows_reach(sessions: async_sessionmaker[AsyncSession], expected: Rows) -> None:
    async def reached() -> Rows | None:
        rows = await usage_rows(sessions)
        return rows if rows == expected else None

    try:
        await until(reached, "usage_minutes as expected", timeout_s=20)
    except AssertionError:
        assert await usage_rows(sessions) == expected
