"""Returning nodes' heartbeats are group-committed (api/return_batch.py), raced through
a real API: each node comes back online with exactly one liveness event however many of
its heartbeats race, they share transactions, and a heartbeat the batch must not decide
(a revoked or wrong credential, another node's id, new agent facts) still gets the
single path's typed answer."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import httpx

from schemas.protocol import HEARTBEAT, NODES
from tests.admin_helpers import credential_id, refused
from tests.api_processes import metric
from tests.api_server import RunningApi
from tests.flows import EnrolledNode, enroll, heartbeat_body
from tests.services import db_fetch

NODES_N = 12
COPIES = 6


async def _beat(client: httpx.AsyncClient, node: EnrolledNode, **extra: object) -> httpx.Response:
    return await client.post(
        HEARTBEAT, json=heartbeat_body(node.node_id, **extra), headers=node.headers
    )


async def _transitions(database_url: str, node_ids: list[str]) -> Counter[str]:
    rows = await db_fetch(
        database_url,
        "SELECT envelope->'data' AS data FROM outbox WHERE envelope->>'action' = $1",
        "node.liveness.changed",
    )
    wanted = set(node_ids)
    changes = [json.loads(row["data"]) for row in rows]
    return Counter(
        change["node_id"]
        for change in changes
        if change["node_id"] in wanted and change["current"] == "online"
    )


async def test_a_returning_fleet_comes_online_once_each_in_shared_transactions(
    api: RunningApi, database_url: str
) -> None:
    with api.client() as client:
        # Enrolled and never heard: offline, and not in the node cache.
        fleet = [enroll(client, api, f"return-{i}") for i in range(NODES_N)]
        batches = metric(client, "modelforge_heartbeat_return_batches_total")
        batched = metric(client, "modelforge_heartbeat_returns_batched_total")
    async with httpx.AsyncClient(base_url=api.base_url, timeout=30) as client:
        answers = await asyncio.gather(
            *(_beat(client, node) for node in fleet for _ in range(COPIES))
        )
    assert [a.status_code for a in answers] == [200] * len(answers), [
        a.text for a in answers if a.status_code != 200
    ]
    # Every copy raced every other; each node's comeback is still one event.
    assert await _transitions(database_url, [n.node_id for n in fleet]) == Counter(
        {node.node_id: 1 for node in fleet}
    )
    with api.client() as client:
        for node in fleet:
            detail = client.get(f"{NODES}/{node.node_id}", headers=api.admin_headers).json()
            assert detail["liveness"] == "online", detail
        written = metric(client, "modelforge_heartbeat_returns_batched_total") - batched
        transactions = metric(client, "modelforge_heartbeat_return_batches_total") - batches
    assert written >= NODES_N
    assert transactions < written, (transactions, written)


async def test_what_the_batch_must_not_decide_gets_the_single_paths_typed_answer(
    api: RunningApi, database_url: str
) -> None:
    with api.client() as client:
        good, revoked, other, newer = (enroll(client, api, f"odd-{i}") for i in range(4))
        answer = client.post(
            f"{NODES}/{revoked.node_id}/credential/revoke", headers=api.admin_headers
        )
        assert answer.status_code == 200, answer.text
    # The revoked node's credential id with a secret that is not its secret.
    wrong = EnrolledNode(
        node_id=good.node_id,
        credential=f"{good.credential.rsplit('.', 1)[0]}.{'A' * 43}",
    )
    assert credential_id(wrong.credential) == credential_id(good.credential)
    async with httpx.AsyncClient(base_url=api.base_url, timeout=30) as client:
        answers = await asyncio.gather(
            _beat(client, good),
            _beat(client, revoked),
            _beat(client, wrong),
            client.post(HEARTBEAT, json=heartbeat_body(good.node_id), headers=other.headers),
            _beat(client, newer, agent_version="2.0.0"),
        )
    ok_good, gone, invalid, mismatch, changed = answers
    assert ok_good.status_code == 200, ok_good.text
    refused(gone, 401, "credential_revoked")
    refused(invalid, 401, "credential_invalid")
    refused(mismatch, 403, "node_mismatch")
    assert changed.status_code == 200, changed.text
    rows = await db_fetch(
        database_url,
        "SELECT envelope->'data' AS data FROM outbox WHERE envelope->>'action' = $1",
        "node.agent.changed",
    )
    versions = [json.loads(r["data"]) for r in rows]
    assert [v["agent_version"] for v in versions if v["node_id"] == newer.node_id] == ["2.0.0"]
    assert await _transitions(database_url, [good.node_id, newer.node_id, other.node_id]) == (
        Counter({good.node_id: 1, newer.node_id: 1})
    )
