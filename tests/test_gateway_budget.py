"""A service client's token budget a day (`max_tokens_per_day`, api/gateway/usage.py)
against the real API and PostgreSQL, the test speaking for the deployment's node: set
on create within its bounds and shown; once spent, the client is refused 429
budget_exhausted in OpenAI's envelope with Retry-After to the next UTC midnight, by
this API process and by another that only knows the database's figure, while another
client is served; the refusal is itself metered. Concurrent invokes near the budget
are all admitted (an invoke counts once it ended), so the budget is overshot by at
most what was in flight, and every process refuses once the rollup holds the sum."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from api.gateway.usage import seconds_to_midnight
from schemas.protocol import SERVICE_CLIENTS
from tests.api_server import ApiFactory, RunningApi
from tests.deployment_flows import (
    DeployedNode,
    HeldChannel,
    answer_invoke,
    completion,
    created_service_client,
    ready_deployment,
    runtime_channel,
)
from tests.measurement_flows import until
from tests.test_gateway_errors import envelope
from tests.usage_flows import call, gateway, rows_reach

# completion(): 3 prompt and 1 completion tokens an answer.
PER_INVOKE = 4


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(8) as executor:
        yield executor


def answer_all(
    channel: HeldChannel, node: DeployedNode, apis: list[RunningApi], count: int
) -> None:
    """The node takes `count` invokes, then answers each (through the API process that
    holds its client, its gateway): all of them were admitted before any ended."""
    by_gateway = {api.state.invokes.id: api for api in apis}
    for invoke in [channel.next_invoke() for _ in range(count)]:
        sent = answer_invoke(by_gateway[invoke["gateway"]], node.node, invoke, completion())
        assert sent.status_code == 200, sent.text


def test_a_budget_is_set_on_create_within_its_bounds(api: RunningApi) -> None:
    with api.client() as client:
        created = created_service_client(client, api, max_tokens_per_day=10**12)
        assert created["max_tokens_per_day"] == 10**12
        shown = client.get(f"{SERVICE_CLIENTS}/{created['id']}", headers=api.admin_headers)
        assert shown.json()["max_tokens_per_day"] == 10**12
        assert created_service_client(client, api)["max_tokens_per_day"] is None
        for wrong in (0, -1, 10**12 + 1, "5", 5.5, True):
            body = {"name": "x", "models": ["smol"], "max_tokens_per_day": wrong}
            refused = client.post(SERVICE_CLIENTS, json=body, headers=api.admin_headers)
            assert refused.status_code == 422, (wrong, refused.text)


async def test_a_spent_budget_is_refused_until_midnight_by_every_process_another_client_served(
    api_factory: ApiFactory, sessions: async_sessionmaker[AsyncSession], pool: ThreadPoolExecutor
) -> None:
    one = gateway(api_factory)
    with one.client() as client:
        deployed = ready_deployment(client, one)
        capped = created_service_client(client, one, name="capped", max_tokens_per_day=10)
        free = created_service_client(client, one, name="free")
    with runtime_channel(one, deployed.node) as channel:
        # 0, 4, then 8 tokens spent: under the budget each time, so answered.
        for _ in range(3):
            answered = pool.submit(call, one, capped["secret"])
            answer_all(channel, deployed, [one], 1)
            assert answered.result(20).status_code == 200
        before = seconds_to_midnight(time.time())
        refused = call(one, capped["secret"])
        after = seconds_to_midnight(time.time())
        envelope(refused, 429, "budget_exhausted")
        assert after <= int(refused.headers["Retry-After"]) <= before
        served = pool.submit(call, one, free["secret"])
        answer_all(channel, deployed, [one], 1)
        assert served.result(20).status_code == 200
        await rows_reach(
            sessions,
            {
                (capped["id"], "smol", "ok"): (3, 9, 3, 0),
                (capped["id"], "smol", "budget_exhausted"): (1, 0, 0, 0),
                (free["id"], "smol", "ok"): (1, 3, 1, 0),
            },
        )
        # A process that never served the client reads the database's figure.
        two = gateway(api_factory)
        envelope(call(two, capped["secret"]), 429, "budget_exhausted")
        assert channel.events == []  # refused before any invoke was sent
    # The second refusal is metered too, by the process that made it.
    await rows_reach(
        sessions,
        {
            (capped["id"], "smol", "ok"): (3, 9, 3, 0),
            (capped["id"], "smol", "budget_exhausted"): (2, 0, 0, 0),
            (free["id"], "smol", "ok"): (1, 3, 1, 0),
        },
    )


async def test_concurrent_invokes_near_the_budget_overshoot_by_at_most_those_in_flight(
    api_factory: ApiFactory, sessions: async_sessionmaker[AsyncSession], pool: ThreadPoolExecutor
) -> None:
    """Budget 20; three invokes at once on each of two processes, all admitted before
    any ended (24 tokens): an invoke counts once it ended, so the budget is overshot by
    at most what was in flight, the bound api/gateway/usage.py states (the budget less
    one, plus 6 x 4: at most 43). Neither process alone counted 20 (12 each): each
    refuses once it read the other's flush back from the rollup, within two flush
    intervals (and the box's load)."""
    budget, at_once = 20, 3
    one, two = gateway(api_factory), gateway(api_factory)
    with one.client() as client:
        deployed = ready_deployment(client, one)
        capped = created_service_client(client, one, max_tokens_per_day=budget)
    client_id = uuid.UUID(capped["id"])
    with runtime_channel(one, deployed.node) as channel:
        calls = [pool.submit(call, api, capped["secret"]) for api in (one, two) * at_once]
        answer_all(channel, deployed, [one, two], 2 * at_once)
        assert [c.result(20).status_code for c in calls] == [200] * 2 * at_once
        ended = time.monotonic()
        spent = 2 * at_once * PER_INVOKE
        assert budget <= spent <= budget - 1 + 2 * at_once * PER_INVOKE

        async def both_know() -> bool:
            known = [api.state.usage.known_today(client_id) for api in (one, two)]
            return all(k is not None and k >= spent for k in known)

        await until(both_know, "both processes know the other's tokens", timeout_s=20)
        # Two intervals (the other's flush, then this one's read), and the box's load.
        assert time.monotonic() - ended < 2 * one.settings.gateway_measure_interval_s + 5
        for api in (one, two):
            envelope(call(api, capped["secret"]), 429, "budget_exhausted")
        assert channel.events == []
    await rows_reach(
        sessions,
        {
            (capped["id"], "smol", "ok"): (2 * at_once, 3 * 2 * at_once, 2 * at_once, 0),
            (capped["id"], "smol", "budget_exhausted"): (2, 0, 0, 0),
        },
    )
