"""A new API process starts with its node cache warm (api/agent/auth.py: warm).

The fleet's nodes come back to a restarted or added API: with the cache filled one
transactional heartbeat at a time, that is one transaction per node at once (the
return storm). Warmed from one read, the first heartbeat of an online node is routine.
Only what a request would admit is warmed: not a revoked credential, a disabled node,
nor a node not recorded online (its first heartbeat must record its return).
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

from schemas.protocol import HEARTBEAT, NODES
from tests.agent.harness import wait_until
from tests.api_processes import metric
from tests.api_server import RunningApi
from tests.flows import EnrolledNode, enroll, heartbeat_body

ApiFactory = Callable[..., RunningApi]
ROUTINE = 'modelforge_heartbeats_total{path="routine"}'
TRANSACTIONAL = 'modelforge_heartbeats_total{path="transactional"}'


def beat(client: httpx.Client, node: EnrolledNode) -> httpx.Response:
    return client.post(HEARTBEAT, json=heartbeat_body(node.node_id), headers=node.headers)


def warmed(api: RunningApi, count: int) -> None:
    wait_until(lambda: len(api.state.node_cache) >= count, 10, f"{count} warmed entries")


def test_a_new_api_process_answers_online_nodes_routinely_from_their_first_heartbeat(
    api_factory: ApiFactory,
) -> None:
    first = api_factory()
    with first.client() as client:
        online = [enroll(client, first, f"warm-{i}") for i in range(3)]
        revoked, disabled, silent = (enroll(client, first, name) for name in "rds")
        for node in [*online, revoked, disabled]:
            assert beat(client, node).status_code == 200
        revoke = f"{NODES}/{revoked.node_id}/credential/revoke"
        assert client.post(revoke, headers=first.admin_headers).status_code == 200
        response = client.patch(
            f"{NODES}/{disabled.node_id}", json={"enabled": False}, headers=first.admin_headers
        )
        assert response.status_code == 200
    # `silent` enrolled but never heartbeated: not online.

    second = api_factory()
    warmed(second, len(online))
    assert len(second.state.node_cache) == len(online)
    with second.client() as client:
        for node in online:
            assert beat(client, node).status_code == 200
        assert metric(client, ROUTINE) == len(online)
        assert metric(client, TRANSACTIONAL) == 0
        # What was not warmed gets what the database says.
        assert beat(client, revoked).json()["code"] == "credential_revoked"
        assert beat(client, disabled).json()["code"] == "node_disabled"
        assert beat(client, silent).status_code == 200
        assert metric(client, TRANSACTIONAL) == 1
