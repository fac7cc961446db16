"""An agent with several API endpoints (`api_urls`) fails over when its current one dies.

Two real `modelforge api` processes on two ports, one database; a real agent process
configured with both. It sticks to the first while that one answers, and moves to the
second when the first is SIGKILLed: its heartbeats and telemetry keep arriving, now
through the second, and it stays online.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from schemas.protocol import TOKENS
from tests.agent.harness import AgentProcess, identity, wait_until, write_config
from tests.api_processes import ADMIN, api_processes, metric
from tests.flows import NODES

StartAgent = Callable[..., AgentProcess]


def detail(client: httpx.Client, node_id: str) -> dict[str, Any]:
    response = client.get(f"{NODES}/{node_id}", headers=ADMIN)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def heartbeats_of(client: httpx.Client) -> float:
    """Heartbeats this API process answered (its own /metrics)."""
    return sum(
        metric(client, f'modelforge_heartbeats_total{{path="{path}"}}')
        for path in ("routine", "transactional")
    )


def test_the_agent_moves_to_the_next_api_endpoint_when_its_current_one_dies(
    database_url: str, nats_url: str, tmp_path: Path, agents: StartAgent
) -> None:
    with (
        api_processes(2, database_url, nats_url, tmp_path, heartbeat_interval_s="0.3") as apis,
        httpx.Client(base_url=apis[0][0], timeout=10) as one,
        httpx.Client(base_url=apis[1][0], timeout=10) as other,
    ):
        (first, proc), (second, _) = apis
        token = one.post(TOKENS, json={}, headers=ADMIN)
        assert token.status_code == 201, token.text
        state = tmp_path / "state"
        config = write_config(
            tmp_path / "agent.yaml",
            api_url=first,
            api_urls=[second],
            state_dir=str(state),
            enrollment_token=token.json()["secret"],
            storage_paths=[str(tmp_path)],
        )
        agent = agents(config)
        agent.wait_for_log(r"enrolled as node")
        node_id = identity(state)["node_id"]
        wait_until(lambda: heartbeats_of(one) >= 2, what="heartbeats on the first API")
        # Sticky: while the first answers, the second hears nothing from the node.
        assert heartbeats_of(other) == 0

        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        agent.wait_for_log(rf"API endpoint {first}\S* failed .*; using {second}")
        wait_until(lambda: heartbeats_of(other) >= 2, what="heartbeats on the second API")
        before = detail(other, node_id)
        wait_until(
            lambda: (
                (now := detail(other, node_id))["last_heartbeat_at"] > before["last_heartbeat_at"]
                and (now["telemetry_stream"] or {}).get("cursor", 0)
                > (before["telemetry_stream"] or {}).get("cursor", 0)
                and now["liveness"] == "online"
            ),
            what="heartbeat and telemetry advancing through the second API",
        )
        assert agent.proc.poll() is None, agent.output
