"""A revoked, disabled or decommissioned node is refused by every API process within 1 s.

Two real `modelforge api` processes on one database: the operator acts through one, the
node keeps heartbeating through the other, whose node cache (api/node_cache.py) has
already made its heartbeats routine (no database read): the change must reach that
cache through its notification, not through a later read.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from agent.processes import start_process, stop_process
from schemas.protocol import ENROLL, HEARTBEAT, NODES, TOKENS
from stack.ports import free_port
from tests.api_server import OPERATOR_KEY
from tests.flows import enroll_body, heartbeat_body

BOUND_S = 1.0
ADMIN = {"X-ModelForge-Admin-Token": OPERATOR_KEY}


@pytest.fixture
def two_apis(database_url: str, nats_url: str, tmp_path: Path) -> Iterator[list[str]]:
    urls, procs = [], []
    for i in range(2):
        port = free_port()
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("MODELFORGE_")},
            "MODELFORGE_DATABASE_URL": database_url,
            "MODELFORGE_NATS_URL": nats_url,
            "MODELFORGE_OPERATOR_API_KEY": OPERATOR_KEY,
            "MODELFORGE_PORT": str(port),
            "MODELFORGE_LOG_LEVEL": "WARNING",
        }
        argv = [sys.executable, "-m", "cli.main", "api"]
        procs.append(start_process(argv, env=env, log_path=tmp_path / f"api-{i}.log"))
        urls.append(f"http://127.0.0.1:{port}")
    try:
        for url in urls:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, (tmp_path / "api-0.log").read_text()
                time.sleep(0.1)
        yield urls
    finally:
        for proc in procs:
            stop_process(proc, timeout_s=15)


def routine_heartbeats(client: httpx.Client) -> float:
    """Heartbeats this API answered from its node cache (its /metrics)."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith('modelforge_heartbeats_total{path="routine"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def refused_within(
    client: httpx.Client, credential: str, node_id: str, status: int, code: str
) -> float:
    """Heartbeat until refused; seconds until then (fails past the bound)."""
    started = time.monotonic()
    headers = {"Authorization": f"Bearer {credential}"}
    while True:
        response = client.post(HEARTBEAT, json=heartbeat_body(node_id), headers=headers)
        elapsed = time.monotonic() - started
        if response.status_code == status:
            assert response.json()["code"] == code
            return elapsed
        assert response.status_code == 200, response.text
        assert elapsed < BOUND_S, f"still accepted {elapsed:.2f}s after the change"
        time.sleep(0.02)


def enrolled(operator: httpx.Client, hostname: str) -> tuple[str, str]:
    token = operator.post(TOKENS, json={}, headers=ADMIN)
    assert token.status_code == 201, token.text
    response = operator.post(ENROLL, json=enroll_body(token.json()["secret"], hostname))
    assert response.status_code == 201, response.text
    return response.json()["node_id"], response.json()["credential"]


@pytest.mark.parametrize(
    ("change", "status", "code"),
    [
        ("revoke", 401, "credential_revoked"),
        ("disable", 403, "node_disabled"),
        ("decommission", 401, "node_decommissioned"),
    ],
)
def test_every_api_process_refuses_within_a_second(
    two_apis: list[str], change: str, status: int, code: str
) -> None:
    with (
        httpx.Client(base_url=two_apis[0], timeout=10) as operator,
        httpx.Client(base_url=two_apis[1], timeout=10) as agent,
    ):
        node_id, credential = enrolled(operator, f"across-{change}")
        headers = {"Authorization": f"Bearer {credential}"}
        warm_until = time.monotonic() + 5
        while routine_heartbeats(agent) == 0:
            assert time.monotonic() < warm_until, "the agent's API never cached the node"
            ok = agent.post(HEARTBEAT, json=heartbeat_body(node_id), headers=headers)
            assert ok.status_code == 200, ok.text
            time.sleep(0.05)
        act: Callable[[], httpx.Response] = {
            "revoke": lambda: operator.post(f"{NODES}/{node_id}/credential/revoke", headers=ADMIN),
            "disable": lambda: operator.patch(
                f"{NODES}/{node_id}", json={"enabled": False}, headers=ADMIN
            ),
            "decommission": lambda: operator.post(
                f"{NODES}/{node_id}/decommission",
                json={"confirm_node_id": node_id, "reason": "test"},
                headers=ADMIN,
            ),
        }[change]
        assert act().status_code == 200
        assert refused_within(agent, credential, node_id, status, code) < BOUND_S
