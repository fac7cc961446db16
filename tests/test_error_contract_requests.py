"""The error contract beyond credentials: enrollment tokens, protocol versions, correlation
ids, validation, body size and routing."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable, Iterator

import pytest

from schemas.protocol import AUDIT
from tests.agent.harness import wait_until
from tests.api_server import OPERATOR_KEY, RunningApi
from tests.contract_helpers import (
    GENERATED_CORRELATION_ID,
    assert_error,
    assert_ok,
    audit_rows,
    node_view,
    unknown_credential,
)
from tests.flows import (
    ENROLL,
    HEARTBEAT,
    INVENTORY,
    NODES,
    TELEMETRY,
    TOKENS,
    create_token,
    enroll,
    enroll_body,
    gpu,
    heartbeat_body,
    inventory_body,
    telemetry_body,
)

# --------------------------------------------------------------------------- enrollment


def test_enroll_missing_token_field_is_422(shared_api: RunningApi) -> None:
    with shared_api.client() as client:
        body = enroll_body("unused")
        del body["enrollment_token"]
        error = assert_error(client.post(ENROLL, json=body), 422, "validation_failed")
        assert any(d["location"][-1] == "enrollment_token" for d in error["details"]), error


def test_enroll_garbage_token_is_invalid(shared_api: RunningApi) -> None:
    garbage = [
        "garbage",
        "mfe.nothex.abcdefghijklmnopqrstuvwxyz",
        f"mfe.{uuid.uuid4().hex}.short",
        f"mfe.{uuid.uuid4().hex}.{secrets.token_urlsafe(32)}",  # well-formed, never issued
        f"mfe.{uuid.uuid4().hex}.{secrets.token_urlsafe(32)}.extra",
    ]
    with shared_api.client() as client:
        for value in garbage:
            response = client.post(ENROLL, json=enroll_body(value))
            assert_error(response, 401, "enrollment_token_invalid")
            assert response.headers.get("WWW-Authenticate") == "Bearer"
            assert value not in response.text


def test_enroll_token_states(api: RunningApi) -> None:
    with api.client() as client:
        # Used: the second enroll with one token is refused.
        used = create_token(client, api)
        assert_ok(client.post(ENROLL, json=enroll_body(used)), 201)
        assert_error(client.post(ENROLL, json=enroll_body(used)), 401, "enrollment_token_used")

        # Wrong secret for an existing token id is invalid, not "used" or "revoked".
        prefix, hex_id, _ = used.split(".")
        forged = f"{prefix}.{hex_id}.{secrets.token_urlsafe(32)}"
        assert_error(client.post(ENROLL, json=enroll_body(forged)), 401, "enrollment_token_invalid")

        # Revoked.
        revoked = create_token(client, api)
        token_id = hex_id_of(revoked)
        assert_ok(client.post(f"{TOKENS}/{token_id}/revoke", headers=api.admin_headers))
        assert_error(
            client.post(ENROLL, json=enroll_body(revoked)), 401, "enrollment_token_revoked"
        )

        # A node credential is not an enrollment token.
        node = enroll(client, api, hostname="other")
        assert_error(
            client.post(ENROLL, json=enroll_body(node.credential)), 401, "enrollment_token_invalid"
        )
        # Nor is the operator key.
        assert_error(
            client.post(ENROLL, json=enroll_body(OPERATOR_KEY)), 401, "enrollment_token_invalid"
        )

        # Expired: once the operator's listing says so (the database clock decides).
        expiring = create_token(client, api, expires_in_s=1)

        def expired() -> bool:
            listed = client.get(TOKENS, params={"state": "expired"}, headers=api.admin_headers)
            return hex_id_of(expiring) in {item["id"] for item in listed.json()["items"]}

        wait_until(expired, 10, "the one-second token expired")
        assert_error(
            client.post(ENROLL, json=enroll_body(expiring)), 401, "enrollment_token_expired"
        )

        # None of the refusals created a node: only the two successful enrollments exist.
        nodes = assert_ok(client.get(NODES, headers=api.admin_headers))["items"]
        assert len(nodes) == 2


def hex_id_of(wire: str) -> str:
    return str(uuid.UUID(hex=wire.split(".")[1]))


@pytest.mark.parametrize("version", [2, 0])
def test_enroll_unsupported_protocol_does_not_burn_token(api: RunningApi, version: int) -> None:
    with api.client() as client:
        token = create_token(client, api)
        body = enroll_body(token, protocol_version=version)
        for _ in range(2):
            error = assert_error(
                client.post(ENROLL, json=body), 409, "protocol_version_unsupported"
            )
            assert error["extra"]["supported"] == [1]
        listed = assert_ok(
            client.get(TOKENS, params={"state": "active"}, headers=api.admin_headers)
        )["items"]
        assert [t["id"] for t in listed] == [hex_id_of(token)]
        # The token is still good for a compatible agent.
        enrolled = assert_ok(client.post(ENROLL, json=enroll_body(token)), 201)
        assert enrolled["protocol_version"] == 1
        assert enrolled["credential"].startswith("mfn.")


def test_heartbeat_with_unsupported_protocol_is_409(shared_api: RunningApi) -> None:
    with shared_api.client() as client:
        node = enroll(client, shared_api)
        before = audit_rows(client, shared_api, target_id=node.node_id)
        for version in (2, 0):
            response = client.post(
                HEARTBEAT,
                json=heartbeat_body(node.node_id, protocol_version=version),
                headers=node.headers,
            )
            error = assert_error(response, 409, "protocol_version_unsupported")
            assert error["extra"]["supported"] == [1]
        view = node_view(client, shared_api, node.node_id)
        assert view["protocol_version"] == 1
        assert view["last_heartbeat_at"] is None
        assert audit_rows(client, shared_api, target_id=node.node_id) == before
        # Version 1 is accepted on the same credential.
        assert_ok(client.post(HEARTBEAT, json=heartbeat_body(node.node_id), headers=node.headers))


# --------------------------------------------------------------------------- correlation ids


def test_client_correlation_id_is_echoed(shared_api: RunningApi) -> None:
    with shared_api.client() as client:
        node = enroll(client, shared_api)
        supplied = "agent-7f3a:req.42_x-1"
        ok = client.post(
            HEARTBEAT,
            json=heartbeat_body(node.node_id),
            headers={**node.headers, "X-Correlation-ID": supplied},
        )
        assert ok.status_code == 200
        assert ok.headers["X-Correlation-ID"] == supplied

        refused = client.post(
            HEARTBEAT, json=heartbeat_body(node.node_id), headers={"X-Correlation-ID": supplied}
        )
        error = assert_error(refused, 401, "credential_missing")
        assert error["correlation_id"] == supplied

        # 128 characters is the longest accepted value.
        longest = "a" * 128
        response = client.get(
            f"{NODES}/{node.node_id}",
            headers={**shared_api.admin_headers, "X-Correlation-ID": longest},
        )
        assert response.headers["X-Correlation-ID"] == longest


def test_unsafe_correlation_id_is_replaced(shared_api: RunningApi) -> None:
    unsafe_values = [
        "a" * 300,
        "<script>",
        "abc<def",
        "has space",
        "semi;colon",
        'quo"te',
        "a" * 129,
    ]
    # Non-ASCII bytes (UTF-8 on the wire) are not acceptable either.
    unsafe_values.append("req-\u00fcml\u00e4ut".encode().decode("latin-1"))
    with shared_api.client() as client:
        for unsafe in unsafe_values:
            response = client.post(
                HEARTBEAT,
                json=heartbeat_body(str(uuid.uuid4())),
                headers={b"X-Correlation-ID": unsafe.encode("latin-1")},
            )
            error = assert_error(response, 401, "credential_missing")
            replaced = response.headers["X-Correlation-ID"]
            assert replaced != unsafe
            assert GENERATED_CORRELATION_ID.match(replaced), replaced
            assert error["correlation_id"] == replaced
            assert unsafe not in response.text


def test_generated_correlation_ids_differ_per_request(shared_api: RunningApi) -> None:
    with shared_api.client() as client:
        ids = {
            assert_error(client.post(HEARTBEAT, json={}), 401)["correlation_id"] for _ in range(5)
        }
        assert len(ids) == 5
        assert all(GENERATED_CORRELATION_ID.match(i) for i in ids)


# --------------------------------------------------------------------------- validation


def test_malformed_json_is_422(shared_api: RunningApi) -> None:
    with shared_api.client() as client:
        node = enroll(client, shared_api)
        headers = {**node.headers, "Content-Type": "application/json"}
        for path, method in ((HEARTBEAT, "POST"), (INVENTORY, "PUT"), (TELEMETRY, "PUT")):
            response = client.request(method, path, content=b'{"node_id": ', headers=headers)
            assert_error(response, 422, "body_unparseable")
        response = client.post(ENROLL, content=b"{not json", headers=headers)
        assert_error(response, 422, "body_unparseable")
        response = client.post(
            ENROLL, content=b"[1, 2]", headers={"Content-Type": "application/json"}
        )
        assert_error(response, 422, "validation_failed")


def test_unknown_field_is_422(shared_api: RunningApi) -> None:
    with shared_api.client() as client:
        node = enroll(client, shared_api)
        bodies = {
            ("POST", HEARTBEAT): {**heartbeat_body(node.node_id), "shell": "rm -rf /"},
            ("PUT", INVENTORY): {**inventory_body(node.node_id, 1), "command": "x"},
            ("PUT", TELEMETRY): {**telemetry_body(node.node_id, 1), "command": "x"},
        }
        for (method, path), body in bodies.items():
            response = client.request(method, path, json=body, headers=node.headers)
            error = assert_error(response, 422, "validation_failed")
            assert error["details"], error
            assert all(d["type"] == "extra_forbidden" for d in error["details"]), error
        # Nested objects forbid unknown fields too.
        nested = inventory_body(node.node_id, 1, gpus=[gpu(0, docker_socket="/var/run")])
        error = assert_error(
            client.put(INVENTORY, json=nested, headers=node.headers), 422, "validation_failed"
        )
        assert error["details"][0]["location"][-1] == "docker_socket"
        tok = create_token(client, shared_api)
        assert_error(
            client.post(ENROLL, json=enroll_body(tok, role="admin")), 422, "validation_failed"
        )
        # The refused enrollment did not consume the token.
        assert_ok(client.post(ENROLL, json=enroll_body(tok)), 201)


def test_naive_timestamp_is_422(shared_api: RunningApi) -> None:
    with shared_api.client() as client:
        node = enroll(client, shared_api)
        naive = "2025-01-01T12:00:00"
        for method, path, body in (
            ("PUT", INVENTORY, {**inventory_body(node.node_id, 1), "observed_at": naive}),
            ("PUT", TELEMETRY, {**telemetry_body(node.node_id, 1), "observed_at": naive}),
            ("POST", HEARTBEAT, heartbeat_body(node.node_id, observed_at=naive)),
        ):
            response = client.request(method, path, json=body, headers=node.headers)
            error = assert_error(response, 422, "validation_failed")
            assert error["details"][0]["location"][-1] == "observed_at", error
        # The same instant with an offset is accepted.
        ok = inventory_body(node.node_id, 1)
        assert_ok(client.put(INVENTORY, json=ok, headers=node.headers))
        view = node_view(client, shared_api, node.node_id)
        assert view["inventory_stream"]["cursor"] == 1


def test_fields_longer_than_their_columns_are_422_not_500(shared_api: RunningApi) -> None:
    """Wire limits match the columns: what validates can be stored, the rest is a 422."""
    with shared_api.client() as client:
        node = enroll(client, shared_api)
        token = create_token(client, shared_api)
        long_version = enroll_body(token, agent_version="v" * 101)
        assert_error(client.post(ENROLL, json=long_version), 422, "validation_failed")
        body = heartbeat_body(node.node_id, agent_version="v" * 101)
        assert_error(
            client.post(HEARTBEAT, json=body, headers=node.headers), 422, "validation_failed"
        )
        report = inventory_body(node.node_id, 1, gpus=[gpu(0, name="n" * 201)])
        assert_error(
            client.put(INVENTORY, json=report, headers=node.headers), 422, "validation_failed"
        )
        # At the limit, both are stored.
        assert_ok(client.post(ENROLL, json=enroll_body(token, agent_version="v" * 100)), 201)
        report = inventory_body(node.node_id, 1, gpus=[gpu(0, name="n" * 200)])
        assert_ok(client.put(INVENTORY, json=report, headers=node.headers))


def test_validation_errors_do_not_echo_secrets(shared_api: RunningApi) -> None:
    with shared_api.client() as client:
        node = enroll(client, shared_api)
        secret = unknown_credential()
        cases = [
            ("POST", HEARTBEAT, heartbeat_body(node.node_id, leaked=secret)),
            ("POST", HEARTBEAT, heartbeat_body(node.node_id, agent_version=[secret])),
            ("PUT", TELEMETRY, {**telemetry_body(node.node_id, 1), "ram_used_bytes": secret}),
            ("POST", ENROLL, enroll_body(secret, token_copy=secret)),
            ("POST", ENROLL, enroll_body(secret, capabilities=secret)),
            ("POST", ENROLL, {**enroll_body("x"), "enrollment_token": [secret]}),
        ]
        for method, path, body in cases:
            response = client.request(method, path, json=body, headers=node.headers)
            assert_error(response, 422, "validation_failed")
            assert secret not in response.text
            assert secret.split(".")[2] not in response.text
            assert node.credential not in response.text


# --------------------------------------------------------------------------- body size


def _chunks(total: int, size: int = 512) -> Iterator[bytes]:
    sent = 0
    while sent < total:
        step = min(size, total - sent)
        yield b" " * step
        sent += step


def test_oversized_body_is_413(api_factory: Callable[..., RunningApi]) -> None:
    small = api_factory(max_body_bytes=2048)
    with small.client() as client:
        node = enroll(client, small)
        padded = heartbeat_body(node.node_id, capabilities=[f"cap.n{i}" for i in range(60)])
        big = inventory_body(node.node_id, 1, gpus=[gpu(i) for i in range(40)])

        # Declared length over the limit.
        response = client.put(INVENTORY, json=big, headers=node.headers)
        assert_error(response, 413, "body_too_large")
        response = client.post(ENROLL, json={**enroll_body("x"), "hostname": "h" * 3000})
        assert_error(response, 413, "body_too_large")

    # Chunked: no Content-Length, the count of what arrives decides.
    def chunked_inventory() -> Iterator[bytes]:
        import json

        payload = json.dumps(big).encode()
        assert len(payload) > 2048
        for i in range(0, len(payload), 256):
            yield payload[i : i + 256]

    with small.client() as client:
        response = client.put(
            INVENTORY,
            content=chunked_inventory(),
            headers={**node.headers, "Content-Type": "application/json"},
        )
        assert "content-length" not in response.request.headers
        assert response.request.headers.get("transfer-encoding") == "chunked"
        assert_error(response, 413, "body_too_large")

    with small.client() as client:
        response = client.post(
            ENROLL, content=_chunks(10_000), headers={"Content-Type": "application/json"}
        )
        assert_error(response, 413, "body_too_large")

    with small.client() as client:
        # Nothing was ingested, and bodies within the limit still work (chunked too).
        view = node_view(client, small, node.node_id)
        assert view["inventory_stream"]["cursor"] == 0
        assert_ok(client.post(HEARTBEAT, json=padded, headers=node.headers))

        def small_chunks() -> Iterator[bytes]:
            import json

            payload = json.dumps(inventory_body(node.node_id, 1)).encode()
            assert len(payload) < 2048
            yield payload[:100]
            yield payload[100:]

        response = client.put(
            INVENTORY,
            content=small_chunks(),
            headers={**node.headers, "Content-Type": "application/json"},
        )
        assert_ok(response)


# --------------------------------------------------------------------------- routing


def test_unknown_route_and_wrong_method(shared_api: RunningApi) -> None:
    with shared_api.client() as client:
        for path in (
            "/api/v1/agent/nope",
            "/api/v2/agent/heartbeat",
            "/definitely-not-here",
        ):
            assert_error(client.get(path), 404, "not_found")
            assert_error(client.post(path, json={}), 404, "not_found")
        error = assert_error(client.get(HEARTBEAT), 405, "method_not_allowed")
        assert error["correlation_id"]
        assert_error(client.delete(INVENTORY), 405, "method_not_allowed")
        assert_error(client.post(TELEMETRY, json={}), 405, "method_not_allowed")
        assert_error(client.get(ENROLL), 405, "method_not_allowed")
        response = client.put(HEARTBEAT, json={})
        assert_error(response, 405, "method_not_allowed")
        assert response.headers["allow"] == "POST"
        # Every method of the path, not only those of the first route that matched.
        response = client.delete(f"{NODES}/{uuid.uuid4()}", headers=shared_api.admin_headers)
        assert_error(response, 405, "method_not_allowed")
        assert response.headers["allow"] == "GET, HEAD, PATCH"


def test_node_credential_is_refused_on_admin_routes(shared_api: RunningApi) -> None:
    with shared_api.client() as client:
        node = enroll(client, shared_api)
        paths = [TOKENS, NODES, f"{NODES}/{node.node_id}", AUDIT]
        for path in paths:
            assert_error(client.get(path, headers=node.headers), 401, "admin_token_missing")
            # Even presented where the operator key goes.
            response = client.get(path, headers={"X-ModelForge-Admin-Token": node.credential})
            assert_error(response, 401, "admin_token_invalid")
        response = client.post(f"{NODES}/{node.node_id}/credential/rotate", headers=node.headers)
        assert_error(response, 401, "admin_token_missing")
        # The credential was not rotated by that attempt.
        assert_ok(client.post(HEARTBEAT, json=heartbeat_body(node.node_id), headers=node.headers))
