"""Values pydantic used to accept but PostgreSQL refuses (or that meant something else)
are 422 with a typed code, in bodies, query strings and paths alike; never a 5xx."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from schemas.agent import SEQUENCE_MAX
from schemas.protocol import AUDIT, DEAD_LETTERS
from tests.api_server import RunningApi
from tests.contract_helpers import assert_error, assert_ok, node_view
from tests.flows import (
    ENROLL,
    HEARTBEAT,
    INVENTORY,
    NODES,
    TELEMETRY,
    TOKENS,
    EnrolledNode,
    create_token,
    enroll,
    enroll_body,
    gpu,
    heartbeat_body,
    inventory_body,
    telemetry_body,
)

NUL = "a\x00b"


def refused(response: httpx.Response, field: str | int | None = None) -> None:
    body = assert_error(response, 422, "validation_failed")
    if field is not None:
        locations = [detail["location"] for detail in body["details"]]
        assert any(field in location for location in locations), locations


def put(
    client: httpx.Client, node: EnrolledNode, path: str, body: dict[str, Any]
) -> httpx.Response:
    return client.put(path, json=body, headers=node.headers)


# --------------------------------------------------------------------------- text


def test_control_characters_in_body_text_are_422(shared_api: RunningApi) -> None:
    with shared_api.client() as client:
        node = enroll(client, shared_api)
        token = create_token(client, shared_api)
        refused(client.post(ENROLL, json=enroll_body(token, agent_version=NUL)), "agent_version")
        refused(client.post(ENROLL, json=enroll_body(token, hostname="gpu\n01")), "hostname")
        body = heartbeat_body(node.node_id, agent_version="1.0\x7f")
        refused(client.post(HEARTBEAT, json=body, headers=node.headers), "agent_version")
        refused(put(client, node, INVENTORY, inventory_body(node.node_id, 1, hostname=NUL)))
        report = inventory_body(node.node_id, 1, gpus=[gpu(0, gpu_uuid="GPU-\x00")])
        refused(put(client, node, INVENTORY, report), "uuid")
        report = telemetry_body(node.node_id, 1)
        report["storage"][0]["path"] = "/data\x00"
        refused(put(client, node, TELEMETRY, report), "path")
        for field in ("display_name", "note"):
            response = client.post(TOKENS, json={field: NUL}, headers=shared_api.admin_headers)
            refused(response, field)
        patch = client.patch(
            f"{NODES}/{node.node_id}",
            json={"display_name": "x\x85y"},
            headers=shared_api.admin_headers,
        )
        refused(patch, "display_name")
        # The token refused above was never consumed, and the node is untouched.
        assert_ok(client.post(ENROLL, json=enroll_body(token)), 201)
        assert node_view(client, shared_api, node.node_id)["inventory_stream"]["cursor"] == 0


def test_lone_surrogate_is_422(shared_api: RunningApi) -> None:
    with shared_api.client() as client:
        node = enroll(client, shared_api)
        # json.dumps writes the escape as-is: valid JSON, but no valid UTF-8 for PostgreSQL.
        raw = json.dumps(heartbeat_body(node.node_id, agent_version="\ud800"))
        response = client.post(
            HEARTBEAT, content=raw, headers={**node.headers, "content-type": "application/json"}
        )
        refused(response, "agent_version")


def test_control_characters_in_query_text_are_422(shared_api: RunningApi) -> None:
    with shared_api.client() as client:
        admin = shared_api.admin_headers
        refused(client.get(NODES, params={"label": "rack=a\x00"}, headers=admin), "label")
        refused(client.get(NODES, params={"label": "=x"}, headers=admin), "label")
        for field in ("actor", "action", "target_type", "target_id", "correlation_id"):
            refused(client.get(AUDIT, params={field: NUL}, headers=admin), field)
        refused(client.get(DEAD_LETTERS, params={"queue": NUL}, headers=admin), "queue")


# --------------------------------------------------------------------------- timestamps

OVERFLOWING = ("0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00")


@pytest.mark.parametrize("stamp", OVERFLOWING)
def test_timestamps_beyond_utc_range_are_422(shared_api: RunningApi, stamp: str) -> None:
    with shared_api.client() as client:
        node = enroll(client, shared_api)
        report = {**inventory_body(node.node_id, 1), "observed_at": stamp}
        refused(put(client, node, INVENTORY, report), "observed_at")
        report = {**telemetry_body(node.node_id, 1), "observed_at": stamp}
        refused(put(client, node, TELEMETRY, report), "observed_at")
        body = heartbeat_body(node.node_id, observed_at=stamp)
        refused(client.post(HEARTBEAT, json=body, headers=node.headers), "observed_at")
        for field in ("since", "until"):
            response = client.get(AUDIT, params={field: stamp}, headers=shared_api.admin_headers)
            refused(response, field)
        # Nothing was applied: the stream is where it was.
        assert node_view(client, shared_api, node.node_id)["inventory_stream"]["cursor"] == 0


def test_a_number_is_not_a_timestamp(shared_api: RunningApi) -> None:
    with shared_api.client() as client:
        node = enroll(client, shared_api)
        report = {**inventory_body(node.node_id, 1), "observed_at": 1_700_000_000}
        refused(put(client, node, INVENTORY, report), "observed_at")


# --------------------------------------------------------------------------- integers


def test_query_and_path_integers_beyond_bigint_are_422(shared_api: RunningApi) -> None:
    beyond = str(2**63)  # beyond BIGINT: this used to reach PostgreSQL
    beyond_uint64 = str(2**64 + 1)
    with shared_api.client() as client:
        admin = shared_api.admin_headers
        refused(client.get(NODES, params={"offset": beyond}, headers=admin), "offset")
        refused(client.get(AUDIT, params={"before_id": beyond}, headers=admin), "before_id")
        refused(client.get(TOKENS, params={"limit": beyond}, headers=admin), "limit")
        # Not a 503: a client's mistake is not an outage (NATS is not even consulted).
        refused(client.get(DEAD_LETTERS, params={"after_seq": beyond_uint64}, headers=admin))
        refused(client.get(f"{DEAD_LETTERS}/{beyond_uint64}", headers=admin), "seq")
        refused(client.post(f"{DEAD_LETTERS}/{beyond_uint64}/replay", headers=admin), "seq")
        refused(client.delete(f"{DEAD_LETTERS}/{beyond_uint64}", headers=admin), "seq")
        # At the edge of the range the query runs (and finds nothing).
        edge = client.get(NODES, params={"offset": str(2**53 - 1)}, headers=admin)
        assert assert_ok(edge)["items"] == []


def test_sequence_has_a_ceiling(shared_api: RunningApi) -> None:
    with shared_api.client() as client:
        node = enroll(client, shared_api)
        refused(put(client, node, INVENTORY, inventory_body(node.node_id, 2**63 - 1)), "sequence")
        refused(put(client, node, TELEMETRY, telemetry_body(node.node_id, SEQUENCE_MAX + 1)))
        # The ceiling itself is a sequence like any other.
        assert_ok(put(client, node, TELEMETRY, telemetry_body(node.node_id, SEQUENCE_MAX)))
        assert_ok(put(client, node, INVENTORY, inventory_body(node.node_id, 1)))


# --------------------------------------------------------------------------- strict JSON


def test_no_silent_coercion(shared_api: RunningApi) -> None:
    with shared_api.client() as client:
        node = enroll(client, shared_api)
        admin = shared_api.admin_headers
        report = {**inventory_body(node.node_id, 1), "sequence": "5"}
        refused(put(client, node, INVENTORY, report), "sequence")
        report = {**inventory_body(node.node_id, 1), "complete": 1}
        refused(put(client, node, INVENTORY, report), "complete")
        report = telemetry_body(node.node_id, 1)
        report["ram_used_bytes"] = 1.5
        refused(put(client, node, TELEMETRY, report), "ram_used_bytes")
        body = heartbeat_body(node.node_id, protocol_version=True)
        refused(client.post(HEARTBEAT, json=body, headers=node.headers), "protocol_version")
        refused(client.post(TOKENS, json={"expires_in_s": True}, headers=admin), "expires_in_s")
        response = client.patch(f"{NODES}/{node.node_id}", json={"enabled": 0}, headers=admin)
        refused(response, "enabled")
        assert node_view(client, shared_api, node.node_id)["enabled"] is True
        # JSON has one number type: 2.0 is the integer 2 (JSON Schema agrees), and an
        # integer is a fine float.
        report = {**inventory_body(node.node_id, 1), "sequence": 2.0}
        assert assert_ok(put(client, node, INVENTORY, report))["sequence"] == 2
        report = telemetry_body(node.node_id, 2)
        report["gpus"] = [{"uuid": "GPU-1", "temperature_c": 60, "power_w": 300}]
        assert_ok(put(client, node, TELEMETRY, report))


# --------------------------------------------------------------------------- duplicates


def test_duplicate_gpus_are_422_in_both_streams(shared_api: RunningApi) -> None:
    with shared_api.client() as client:
        node = enroll(client, shared_api)
        report = telemetry_body(node.node_id, 1, gpu_uuids=["GPU-a", "GPU-a"])
        refused(put(client, node, TELEMETRY, report), "gpus")
        report = telemetry_body(node.node_id, 1, gpu_uuids=["GPU-a", "gpu-A"])
        refused(put(client, node, TELEMETRY, report), "gpus")
        same_index = [gpu(0), gpu(0)]
        refused(
            put(client, node, INVENTORY, inventory_body(node.node_id, 1, gpus=same_index)), "gpus"
        )
        same_uuid = [gpu(0, gpu_uuid="GPU-ab"), gpu(1, gpu_uuid="GPU-AB")]
        refused(
            put(client, node, INVENTORY, inventory_body(node.node_id, 1, gpus=same_uuid)), "gpus"
        )
        assert node_view(client, shared_api, node.node_id)["gpus"] == []


# --------------------------------------------------------------------------- unparseable

UNPARSEABLE = {
    "invalid_utf8": b'{"node_id": "\xff\xfe"}',
    "deep_nesting": b"[" * 100_000 + b"]" * 100_000,
    "huge_number": b'{"sequence": ' + b"9" * 5000 + b"}",
    "syntax": b'{"node_id": ',
}


@pytest.mark.parametrize("name", sorted(UNPARSEABLE))
def test_unparseable_bodies_are_422_with_a_typed_code(shared_api: RunningApi, name: str) -> None:
    with shared_api.client() as client:
        node = enroll(client, shared_api)
        headers = {**node.headers, "content-type": "application/json"}
        for method, path in (("POST", HEARTBEAT), ("PUT", INVENTORY), ("POST", ENROLL)):
            response = client.request(method, path, content=UNPARSEABLE[name], headers=headers)
            assert_error(response, 422, "body_unparseable")
        admin = {**shared_api.admin_headers, "content-type": "application/json"}
        response = client.post(TOKENS, content=UNPARSEABLE[name], headers=admin)
        assert_error(response, 422, "body_unparseable")
