"""The error contract on the agent routes: every route x every credential case gives the
contract's status and code, and a refused request changes nothing."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.admin_helpers import decommission
from tests.api_server import OPERATOR_KEY, RunningApi
from tests.contract_helpers import (
    assert_error,
    assert_ok,
    bearer,
    node_view,
    unknown_credential,
)
from tests.flows import (
    HEARTBEAT,
    INVENTORY,
    NODES,
    TELEMETRY,
    EnrolledNode,
    enroll,
    gpu,
    heartbeat_body,
    inventory_body,
    telemetry_body,
)

# --------------------------------------------------------------------------- agent matrix


@dataclass(frozen=True)
class AgentRoute:
    method: str
    path: str
    body: Callable[[str], dict[str, Any]]


AGENT_ROUTES = {
    "heartbeat": AgentRoute("POST", HEARTBEAT, heartbeat_body),
    "inventory": AgentRoute(
        "PUT", INVENTORY, lambda node_id: inventory_body(node_id, 1, gpus=[gpu(0), gpu(1)])
    ),
    "telemetry": AgentRoute("PUT", TELEMETRY, lambda node_id: telemetry_body(node_id, 1)),
}


@dataclass(frozen=True)
class Attempt:
    """Who claims to be whom: the headers sent and the node_id put in the body."""

    headers: dict[str, str]
    node_id: str
    status: int
    code: str | None
    # The node whose state must be untouched by a refused request.
    untouched: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _enrolled(client: httpx.Client, api: RunningApi, name: str = "node-a") -> EnrolledNode:
    return enroll(client, api, hostname=name)


def case_valid(client: httpx.Client, api: RunningApi) -> Attempt:
    a = _enrolled(client, api)
    return Attempt(a.headers, a.node_id, 200, None)


def case_missing(client: httpx.Client, api: RunningApi) -> Attempt:
    a = _enrolled(client, api)
    return Attempt({}, a.node_id, 401, "credential_missing", a.node_id)


def case_bearer_nonsense(client: httpx.Client, api: RunningApi) -> Attempt:
    a = _enrolled(client, api)
    return Attempt(bearer("nonsense"), a.node_id, 401, "credential_malformed", a.node_id)


def case_bearer_empty(client: httpx.Client, api: RunningApi) -> Attempt:
    a = _enrolled(client, api)
    return Attempt({"Authorization": "Bearer"}, a.node_id, 401, "credential_malformed", a.node_id)


def case_basic_scheme(client: httpx.Client, api: RunningApi) -> Attempt:
    a = _enrolled(client, api)
    # A perfectly valid credential under the wrong scheme is still malformed.
    headers = {"Authorization": f"Basic {a.credential}"}
    return Attempt(headers, a.node_id, 401, "credential_malformed", a.node_id)


def case_token_scheme(client: httpx.Client, api: RunningApi) -> Attempt:
    a = _enrolled(client, api)
    headers = {"Authorization": f"Token {a.credential}"}
    return Attempt(headers, a.node_id, 401, "credential_malformed", a.node_id)


def case_unknown(client: httpx.Client, api: RunningApi) -> Attempt:
    a = _enrolled(client, api)
    return Attempt(bearer(unknown_credential()), a.node_id, 401, "credential_invalid", a.node_id)


def case_wrong_secret(client: httpx.Client, api: RunningApi) -> Attempt:
    a = _enrolled(client, api)
    prefix, hex_id, _ = a.credential.split(".")
    forged = f"{prefix}.{hex_id}.{secrets.token_urlsafe(32)}"
    return Attempt(bearer(forged), a.node_id, 401, "credential_invalid", a.node_id)


def case_revoked(client: httpx.Client, api: RunningApi) -> Attempt:
    a = _enrolled(client, api)
    response = client.post(f"{NODES}/{a.node_id}/credential/revoke", headers=api.admin_headers)
    assert_ok(response)
    return Attempt(a.headers, a.node_id, 401, "credential_revoked", a.node_id)


def case_disabled(client: httpx.Client, api: RunningApi) -> Attempt:
    a = _enrolled(client, api)
    response = client.patch(
        f"{NODES}/{a.node_id}", json={"enabled": False}, headers=api.admin_headers
    )
    assert assert_ok(response)["liveness"] == "disabled"
    return Attempt(a.headers, a.node_id, 403, "node_disabled", a.node_id)


def case_decommissioned(client: httpx.Client, api: RunningApi) -> Attempt:
    a = _enrolled(client, api)
    assert_ok(decommission(client, api, a.node_id))
    return Attempt(a.headers, a.node_id, 401, "node_decommissioned", a.node_id)


def case_other_node(client: httpx.Client, api: RunningApi) -> Attempt:
    a = _enrolled(client, api, "node-a")
    b = _enrolled(client, api, "node-b")
    return Attempt(b.headers, a.node_id, 403, "node_mismatch", a.node_id, {"also": b.node_id})


def case_operator_key_as_bearer(client: httpx.Client, api: RunningApi) -> Attempt:
    a = _enrolled(client, api)
    return Attempt(bearer(OPERATOR_KEY), a.node_id, 401, "credential_malformed", a.node_id)


def case_operator_key_admin_header(client: httpx.Client, api: RunningApi) -> Attempt:
    a = _enrolled(client, api)
    return Attempt(api.admin_headers, a.node_id, 401, "credential_missing", a.node_id)


CASES: dict[str, Callable[[httpx.Client, RunningApi], Attempt]] = {
    "valid": case_valid,
    "missing": case_missing,
    "bearer-nonsense": case_bearer_nonsense,
    "bearer-empty": case_bearer_empty,
    "basic-scheme": case_basic_scheme,
    "token-scheme": case_token_scheme,
    "unknown": case_unknown,
    "wrong-secret": case_wrong_secret,
    "revoked": case_revoked,
    "disabled": case_disabled,
    "decommissioned": case_decommissioned,
    "other-node": case_other_node,
    "operator-key-as-bearer": case_operator_key_as_bearer,
    "operator-key-admin-header": case_operator_key_admin_header,
}


def _untouched(client: httpx.Client, api: RunningApi, node_id: str) -> None:
    """A refused agent request changed nothing on the node it named."""
    view = node_view(client, api, node_id)
    assert view["last_heartbeat_at"] is None
    assert view["inventory"] is None and view["inventory_stream"]["cursor"] == 0
    assert view["telemetry"] is None and view["telemetry_stream"]["cursor"] == 0
    assert view["gpus"] == []


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("route", list(AGENT_ROUTES))
def test_agent_route_credential_matrix(shared_api: RunningApi, route: str, case: str) -> None:
    spec = AGENT_ROUTES[route]
    with shared_api.client() as client:
        attempt = CASES[case](client, shared_api)
        response = client.request(
            spec.method, spec.path, json=spec.body(attempt.node_id), headers=attempt.headers
        )
        if attempt.status == 200:
            # The control case: the same body with the right credential is accepted and lands.
            assert assert_ok(response)["node_id"] == attempt.node_id
            view = node_view(client, shared_api, attempt.node_id)
            landed = {
                "heartbeat": view["last_heartbeat_at"] is not None,
                "inventory": view["inventory_stream"]["cursor"] == 1 and len(view["gpus"]) == 2,
                "telemetry": view["telemetry_stream"]["cursor"] == 1,
            }
            assert landed[route], view
            return
        assert_error(response, attempt.status, attempt.code)
        if attempt.status == 401:
            assert response.headers.get("WWW-Authenticate") == "Bearer"
        # Never reflect what was presented.
        presented = attempt.headers.get("Authorization", "").partition(" ")[2]
        if len(presented) > 10:
            assert presented not in response.text
        assert attempt.untouched is not None
        _untouched(client, shared_api, attempt.untouched)
        if "also" in attempt.extra:
            _untouched(client, shared_api, attempt.extra["also"])
