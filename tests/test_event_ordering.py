"""Per-node event order under concurrency: outbox position order is each node's commit order.

Concurrent heartbeats that each change the agent version race for one node. Every
node.agent.changed event names the version it replaced, so in position order the
events must form one unbroken chain ending at the node's stored version. Without the
per-node lock two requests read the same "previous" version and the chain forks.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

from tests.api_server import RunningApi
from tests.flows import HEARTBEAT, INVENTORY, NODES, enroll, gpu, heartbeat_body, inventory_body
from tests.services import db_fetch


async def _agent_events(database_url: str, node_id: str) -> list[dict[str, Any]]:
    rows = await db_fetch(
        database_url,
        "SELECT envelope->'data' AS data FROM outbox WHERE subject = $1 ORDER BY position",
        f"modelforge.v1.node.{node_id}.agent.changed",
    )
    return [json.loads(row["data"]) for row in rows]


async def test_concurrent_agent_changes_form_one_chain(api: RunningApi, database_url: str) -> None:
    with api.client() as client:
        node = enroll(client, api)
        # GPUs give the inventories something to emit while the heartbeats race.
        gpus = [gpu(i) for i in range(4)]
    async with api.async_client() as http:
        for round_number in range(3):
            go = asyncio.Event()

            async def beat(version: str, go: asyncio.Event = go) -> int:
                await go.wait()
                body = heartbeat_body(node.node_id, agent_version=version)
                response = await http.post(HEARTBEAT, json=body, headers=node.headers)
                return response.status_code

            async def report(sequence: int, go: asyncio.Event = go) -> int:
                await go.wait()
                body = inventory_body(node.node_id, sequence, gpus=gpus[: sequence % 4 + 1])
                response = await http.put(INVENTORY, json=body, headers=node.headers)
                return response.status_code

            tasks = [asyncio.create_task(beat(f"2.{round_number}.{i}")) for i in range(12)]
            tasks += [asyncio.create_task(report(round_number * 10 + i + 1)) for i in range(4)]
            await asyncio.sleep(0.05)  # pacing: every task is at the gate before it opens
            go.set()
            statuses = await asyncio.gather(*tasks)
            # Inventories may race each other's sequence (409), heartbeats never fail.
            assert statuses[:12] == [200] * 12
            assert set(statuses[12:]) <= {200, 409}

    events = await _agent_events(database_url, node.node_id)
    assert len(events) >= 3
    assert events[0]["previous_agent_version"] == "1.0.0"
    for before, after in itertools.pairwise(events):
        assert after["previous_agent_version"] == before["agent_version"], events
    with api.client() as client:
        detail = client.get(f"{NODES}/{node.node_id}", headers=api.admin_headers).json()
    assert detail["agent_version"] == events[-1]["agent_version"]
