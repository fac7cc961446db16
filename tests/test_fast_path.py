"""The fleet's raw routes (api/agent/fast_path.py) against a real API and database.

They answer only the common case (a cached node's routine heartbeat, a cached node's
telemetry) and hand everything else to the documented route: these tests check both
sides by the path's own counter, and that what comes back is what the documented route
answers: the same shape, the same ordering rules, the same error contract.
"""

from __future__ import annotations

import httpx

from schemas.protocol import CORRELATION_HEADER, HEARTBEAT, TELEMETRY
from tests.api_processes import cached, fast, metric
from tests.api_server import RunningApi
from tests.flows import enroll, heartbeat_body, telemetry_body


def test_a_cached_nodes_routine_heartbeat_and_telemetry_are_answered_by_the_raw_routes(
    api: RunningApi,
) -> None:
    with api.client() as client:
        node = enroll(client, api, "fast-1")
        cached(client, node)
        beat = client.post(HEARTBEAT, json=heartbeat_body(node.node_id), headers=node.headers)
        assert beat.status_code == 200
        assert beat.headers["content-type"] == "application/json"
        assert beat.headers[CORRELATION_HEADER]
        assert set(beat.json()) == {
            "node_id",
            "received_at",
            "heartbeat_interval_s",
            "server_time",
        }
        assert beat.json()["node_id"] == node.node_id

        answered = fast(client, TELEMETRY, "answered")
        sample = client.put(TELEMETRY, json=telemetry_body(node.node_id, 1), headers=node.headers)
        assert sample.status_code == 200, sample.text
        assert sample.json()["applied"] is True
        assert sample.json()["sequence"] == 1
        assert fast(client, TELEMETRY, "answered") == answered + 1

        # The same ordering rules and error contract as the documented route.
        again = client.put(TELEMETRY, json=telemetry_body(node.node_id, 1), headers=node.headers)
        assert again.status_code == 409, again.text
        assert again.json()["code"] == "sequence_replayed"
        assert again.json()["correlation_id"] == again.headers[CORRELATION_HEADER]
        assert again.json()["extra"] == {"stream": "telemetry", "cursor": 1}
        other = client.put(
            TELEMETRY, json=telemetry_body(enroll(client, api, "fast-2").node_id, 2),
            headers=node.headers,
        )  # fmt: skip
        assert other.status_code == 403, other.text
        assert other.json()["code"] == "node_mismatch"


def test_whatever_the_raw_routes_do_not_answer_goes_to_the_documented_route(
    api: RunningApi,
) -> None:
    with api.client() as client:
        node = enroll(client, api, "fast-3")
        cached(client, node)
        declined = {route: fast(client, route, "declined") for route in (HEARTBEAT, TELEMETRY)}
        transactional = metric(client, 'modelforge_heartbeats_total{path="transactional"}')

        # News in a heartbeat: the transactional path records it.
        news = heartbeat_body(node.node_id, agent_version="1.0.1")
        assert client.post(HEARTBEAT, json=news, headers=node.headers).status_code == 200
        after = metric(client, 'modelforge_heartbeats_total{path="transactional"}')
        assert after == transactional + 1

        # Bodies the documented route refuses, refused as it refuses them.
        bad = telemetry_body(node.node_id, 5) | {"sequence": "5"}
        refused = client.put(TELEMETRY, json=bad, headers=node.headers)
        assert refused.status_code == 422, refused.text
        assert refused.json()["code"] == "validation_failed"
        assert refused.json()["details"][0]["location"] == ["body", "sequence"]
        unparseable = client.put(
            TELEMETRY,
            content=b"{not json",
            headers=node.headers | {"content-type": "application/json"},
        )
        assert unparseable.status_code == 422
        assert unparseable.json()["code"] == "body_unparseable"
        as_text = client.put(
            TELEMETRY,
            content=httpx.Request("PUT", "/", json=telemetry_body(node.node_id, 6)).content,
            headers=node.headers | {"content-type": "text/plain"},
        )
        assert as_text.status_code == 422, as_text.text

        # A credential the cache does not hold: the documented route's 401.
        stranger = {"Authorization": "Bearer mfn.not-a-credential"}
        unknown = client.post(HEARTBEAT, json=heartbeat_body(node.node_id), headers=stranger)
        assert unknown.status_code == 401
        assert unknown.headers["www-authenticate"] == "Bearer"

        assert fast(client, HEARTBEAT, "declined") == declined[HEARTBEAT] + 2
        assert fast(client, TELEMETRY, "declined") == declined[TELEMETRY] + 3
