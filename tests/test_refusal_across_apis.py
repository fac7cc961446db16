"""A revoked, disabled or decommissioned node is refused by every API process within 1 s.

Two real `modelforge api` processes on one database: the operator acts through one, the
node keeps heartbeating through the other, whose node cache (api/node_cache.py) has
already made its heartbeats routine (no database read): the change must reach that
cache through its notification, not through a later read. The same cache admits the
node's telemetry without a credential read, so telemetry is refused within the bound too.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from schemas.protocol import HEARTBEAT, TELEMETRY
from tests.api_processes import REFUSALS, answered_from_cache, api_processes, enrolled, refuse
from tests.flows import EnrolledNode, heartbeat_body, telemetry_body

BOUND_S = 1.0


@pytest.fixture
def two_apis(database_url: str, nats_url: str, tmp_path: Path) -> Iterator[list[str]]:
    with api_processes(2, database_url, nats_url, tmp_path) as started:
        yield [url for url, _ in started]


def refused_within(
    client: httpx.Client, credential: str, node_id: str, route: str, status: int, code: str
) -> float:
    """Send on `route` until refused; seconds until then (fails past the bound)."""
    started = time.monotonic()
    headers = {"Authorization": f"Bearer {credential}"}
    sequences = itertools.count(1_000)
    while True:
        if route == HEARTBEAT:
            response = client.post(HEARTBEAT, json=heartbeat_body(node_id), headers=headers)
        else:
            body = telemetry_body(node_id, next(sequences))
            response = client.put(TELEMETRY, json=body, headers=headers)
        elapsed = time.monotonic() - started
        if response.status_code == status:
            assert response.json()["code"] == code
            return elapsed
        assert response.status_code == 200, response.text
        assert elapsed < BOUND_S, f"still accepted {elapsed:.2f}s after the change"
        time.sleep(0.02)


@pytest.mark.parametrize("route", [HEARTBEAT, TELEMETRY], ids=["heartbeat", "telemetry"])
@pytest.mark.parametrize(
    ("change", "status", "code"),
    REFUSALS,
)
def test_every_api_process_refuses_within_a_second(
    two_apis: list[str], route: str, change: str, status: int, code: str
) -> None:
    with (
        httpx.Client(base_url=two_apis[0], timeout=10) as operator,
        httpx.Client(base_url=two_apis[1], timeout=10) as agent,
    ):
        node_id, credential = enrolled(operator, f"across-{change}")
        answered_from_cache(agent, EnrolledNode(node_id, credential))
        refuse(operator, node_id, change)
        assert refused_within(agent, credential, node_id, route, status, code) < BOUND_S
