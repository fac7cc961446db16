"""`modelforge admin overview` over the real API and PostgreSQL: the fleet now and the
gateway's last complete minute, as the dashboard's Overview opens with them, each line
within an 80-column terminal; --json is the API's answer whole."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from schemas.overview import OverviewNow
from store.rollup import usage
from tests.api_server import ApiFactory, RunningApi
from tests.cli_support import Admin, ok
from tests.deployment_flows import ready_deployment
from tests.test_admin_overview import database_minute, invokes

pytest_plugins = ["tests.cli_fixtures"]


@pytest.fixture
def api(api_factory: ApiFactory) -> RunningApi:
    return api_factory(pipeline=False)


async def test_overview_shows_the_fleet_and_the_gateways_minute_in_80_columns(
    api: RunningApi, admin: Admin, sessions: async_sessionmaker[AsyncSession]
) -> None:
    with api.client() as http:
        ready_deployment(http, api)
    minute = await database_minute(sessions)
    # The same invokes in this minute and the two before: whichever is the last complete
    # minute when the command asks, it holds them.
    async with sessions() as session, session.begin():
        for at in (minute - timedelta(minutes=2), minute - timedelta(minutes=1), minute):
            await usage.add(
                session, [invokes(at, "ok", 120, 0.4), invokes(at, "rate_limited", 30, None)]
            )
    shown = ok(admin("overview", columns=80))
    lines = shown.splitlines()
    assert lines and all(len(line) <= 80 for line in lines), shown
    rows = {line.split(":", 1)[0].strip(): line.split(":", 1)[1].strip() for line in lines}
    assert rows["Nodes"] == "1 online"
    assert rows["GPUs"] == "none"  # the test's node reports a CPU device only
    assert rows["Deployments"] == "1 ready"
    assert rows["Requests"] == "2.50/s"
    assert rows["Errors"] == "0.50/s (rate_limited 0.50/s)"
    assert rows["Tokens"] == "165.0/s (15.0 in, 150.0 out)"
    assert rows["TTFT"].startswith("p50 ") and rows["TTFT"].endswith(" ms")
    assert rows["Gateway"].startswith("the minute from ")
    whole = OverviewNow.model_validate_json(ok(admin("overview", "--json")))
    assert whole.deployments["ready"] == 1 and whole.nodes["online"] == 1
    assert whole.gateway.errors == {"rate_limited": pytest.approx(0.5)}
