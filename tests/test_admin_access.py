"""The admin API fails closed: no operator key, wrong key, missing key."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from schemas.protocol import ADMIN_PREFIX, AUDIT
from tests.admin_helpers import (
    audit,
    ok,
    refused,
)
from tests.api_server import OPERATOR_KEY, ApiFactory, RunningApi
from tests.flows import (
    HEARTBEAT,
    NODES,
)

# --------------------------------------------------------------------------- fail closed


def admin_operations(client: httpx.Client) -> list[tuple[str, str]]:
    spec = ok(client.get("/openapi.json"))
    operations = [
        (method.upper(), path)
        for path, methods in spec["paths"].items()
        if path.startswith(ADMIN_PREFIX)
        for method in methods
        if method in {"get", "post", "put", "patch", "delete"}
    ]
    # Guard against an empty or truncated enumeration.
    assert len(operations) >= 11, operations
    assert ("POST", "/api/v1/admin/hardware/nodes/{node_id}/decommission") in operations
    assert ("GET", AUDIT) in operations
    return operations


def call_admin(
    client: httpx.Client, method: str, path: str, headers: dict[str, str]
) -> httpx.Response:
    concrete = path
    for name in (
        "node_id",
        "token_id",
        "incident_id",
        "job_id",
        "profile_id",
        "client_id",
        "deployment_id",
        "service_id",
    ):
        concrete = concrete.replace("{" + name + "}", str(uuid.uuid4()))
    concrete = concrete.replace("{seq}", "1")
    assert "{" not in concrete, path
    body: dict[str, Any] | None = {} if method in {"POST", "PUT", "PATCH"} else None
    return client.request(method, concrete, json=body, headers=headers)


@pytest.mark.parametrize("key", [None, ""], ids=["unset", "empty"])
def test_admin_fails_closed_without_operator_key(api_factory: ApiFactory, key: str | None) -> None:
    api = api_factory(operator_api_key=key)
    assert not api.settings.admin_enabled
    with api.client() as client:
        operations = admin_operations(client)
        variants = [
            {"X-ModelForge-Admin-Token": OPERATOR_KEY},
            {"X-ModelForge-Admin-Token": ""},
            {},
        ]
        for method, path in operations:
            for headers in variants:
                response = call_admin(client, method, path, headers)
                refused(response, 403, "admin_api_disabled")
        # Agent routes are unaffected by the admin switch.
        refused(client.post(HEARTBEAT, json={}), 401, "credential_missing")


def test_admin_key_checks(api: RunningApi) -> None:
    with api.client() as client:
        for method, path in admin_operations(client):
            refused(call_admin(client, method, path, {}), 401, "admin_token_missing")
            refused(
                call_admin(client, method, path, {"X-ModelForge-Admin-Token": ""}),
                401,
                "admin_token_missing",
            )
            wrong = {"X-ModelForge-Admin-Token": OPERATOR_KEY + "x"}
            response = call_admin(client, method, path, wrong)
            refused(response, 401, "admin_token_invalid")
            assert OPERATOR_KEY not in response.text
            prefix = {"X-ModelForge-Admin-Token": OPERATOR_KEY[:-1]}
            refused(call_admin(client, method, path, prefix), 401, "admin_token_invalid")
        # The key in the Authorization header is not the admin header.
        response = client.get(NODES, headers={"Authorization": f"Bearer {OPERATOR_KEY}"})
        refused(response, 401, "admin_token_missing")
        assert audit(client, api) == []
