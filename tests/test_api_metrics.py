"""`/metrics` of the API: requests by route template, heartbeats, ingest decisions and
authentication refusals, from real requests; never an identifier in a label."""

from __future__ import annotations

import re

from tests.api_server import RunningApi
from tests.contract_helpers import unknown_credential
from tests.flows import HEARTBEAT, INVENTORY, NODES, enroll, heartbeat_body, inventory_body


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample of the Prometheus text format (0 when absent)."""
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split(" ")[0]))
        if line.split("{")[0].split(" ")[0] == name and found == labels:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_metrics_count_what_the_api_did(api: RunningApi) -> None:
    with api.client() as client:
        node = enroll(client, api)
        for _ in range(3):
            client.post(HEARTBEAT, json=heartbeat_body(node.node_id), headers=node.headers)
        report = inventory_body(node.node_id, 1)
        assert client.put(INVENTORY, json=report, headers=node.headers).status_code == 200
        assert client.put(INVENTORY, json=report, headers=node.headers).status_code == 409
        bad = {"Authorization": f"Bearer {unknown_credential()}"}
        assert (
            client.post(HEARTBEAT, json=heartbeat_body(node.node_id), headers=bad).status_code
            == 401
        )
        assert client.get(f"{NODES}/{node.node_id}").status_code == 401
        response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    # The first one brings the node online (a transaction); the next are routine unless
    # they beat the first flush that teaches the API the database clock.
    routine = sample(text, "modelforge_heartbeats_total", path="routine")
    transactional = sample(text, "modelforge_heartbeats_total", path="transactional")
    assert routine + transactional == 3 and transactional >= 1
    route = {"route": HEARTBEAT, "method": "POST"}
    assert sample(text, "modelforge_http_requests_total", **route, status="200") == 3
    assert sample(text, "modelforge_http_requests_total", **route, status="401") == 1
    assert sample(text, "modelforge_http_request_duration_seconds_count", **route) == 4
    decisions = {"stream": "inventory"}
    assert sample(text, "modelforge_ingest_decisions_total", **decisions, decision="applied") == 1
    assert sample(text, "modelforge_ingest_decisions_total", **decisions, decision="replay") == 1
    assert sample(text, "modelforge_auth_failures_total", code="credential_invalid") == 1
    assert sample(text, "modelforge_auth_failures_total", code="admin_token_missing") == 1
    # Route templates only: no node id, no credential, in any label.
    detail = {"route": NODES + "/{node_id}", "method": "GET", "status": "401"}
    assert sample(text, "modelforge_http_requests_total", **detail) == 1
    assert node.node_id not in text and node.credential not in text
