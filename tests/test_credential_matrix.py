"""Each route family accepts its own credential kind and no other, over real HTTP.

Families: the agent protocol (a node credential as a bearer), the admin API (the
operator key in its header), the gateway (a service client secret as a bearer). Kinds:
none, a node credential, a live service client secret, a revoked one, the operator key.
Every refusal is a 401 with the family's error body and the request's correlation id:
ModelForge's ErrorBody on the agent and admin routes, OpenAI's envelope on the gateway
(schemas/gateway.py: GatewayErrorBody).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import httpx
import pytest

from schemas.protocol import (
    ADMIN_HEADER,
    GATEWAY_MODELS,
    HEARTBEAT,
    NODES,
)
from tests.api_server import OPERATOR_KEY, RunningApi
from tests.deployment_flows import live_and_revoked
from tests.flows import enroll, heartbeat_body


class Kind(StrEnum):
    NONE = "none"
    NODE = "node_credential"
    SERVICE = "service_client"
    REVOKED_SERVICE = "revoked_service_client"
    OPERATOR = "operator_key"


class Family(StrEnum):
    AGENT = "agent"
    ADMIN = "admin"
    GATEWAY = "gateway"


@dataclass(frozen=True)
class Presented:
    node_id: str
    values: dict[Kind, str | None]


@pytest.fixture(scope="module")
def presented(shared_api: RunningApi) -> Presented:
    api = shared_api
    with api.client() as client:
        node = enroll(client, api, hostname="matrix-host")
        live, revoked = live_and_revoked(client, api, "matrix")
    return Presented(
        node_id=node.node_id,
        values={
            Kind.NONE: None,
            Kind.NODE: node.credential,
            Kind.SERVICE: live,
            Kind.REVOKED_SERVICE: revoked,
            Kind.OPERATOR: OPERATOR_KEY,
        },
    )


def _bearer(value: str | None) -> dict[str, str]:
    return {} if value is None else {"Authorization": f"Bearer {value}"}


def _call(family: Family, client: httpx.Client, creds: Presented, kind: Kind) -> httpx.Response:
    value = creds.values[kind]
    if family is Family.AGENT:
        return client.post(HEARTBEAT, json=heartbeat_body(creds.node_id), headers=_bearer(value))
    if family is Family.ADMIN:
        return client.get(NODES, headers={} if value is None else {ADMIN_HEADER: value})
    return client.get(GATEWAY_MODELS, headers=_bearer(value))


# What each family answers each kind: None is success, else the 401's code.
EXPECTED: dict[Family, dict[Kind, str | None]] = {
    Family.AGENT: {
        Kind.NONE: "credential_missing",
        Kind.NODE: None,
        Kind.SERVICE: "credential_malformed",
        Kind.REVOKED_SERVICE: "credential_malformed",
        Kind.OPERATOR: "credential_malformed",
    },
    Family.ADMIN: {
        Kind.NONE: "admin_token_missing",
        Kind.NODE: "admin_token_invalid",
        Kind.SERVICE: "admin_token_invalid",
        Kind.REVOKED_SERVICE: "admin_token_invalid",
        Kind.OPERATOR: None,
    },
    Family.GATEWAY: {
        Kind.NONE: "credential_missing",
        Kind.NODE: "credential_malformed",
        Kind.SERVICE: None,
        Kind.REVOKED_SERVICE: "credential_revoked",
        Kind.OPERATOR: "credential_malformed",
    },
}


def _accepted(family: Family, response: httpx.Response) -> None:
    assert response.status_code == 200, response.text
    assert response.headers.get("X-Correlation-ID")
    body = response.json()
    if family is Family.GATEWAY:
        assert body["object"] == "list" and isinstance(body["data"], list), body
    elif family is Family.ADMIN:
        assert isinstance(body["items"], list), body


def _refused(family: Family, response: httpx.Response, code: str) -> None:
    assert response.status_code == 401, response.text
    correlation_id = response.headers.get("X-Correlation-ID")
    assert correlation_id, "no X-Correlation-ID on a refusal"
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    # The gateway answers in OpenAI's envelope; the other families in ErrorBody.
    error = body["error"] if family is Family.GATEWAY else body
    assert error["code"] == code, body
    assert error["correlation_id"] == correlation_id, body
    assert isinstance(error["message"], str) and error["message"], body
    if family is Family.GATEWAY:
        assert isinstance(error["type"], str) and error["type"], body


CASES: list[tuple[Family, Kind]] = [(family, kind) for family in Family for kind in Kind]


@pytest.mark.parametrize(("family", "kind"), CASES, ids=[f"{f}-{k}" for f, k in CASES])
def test_each_family_accepts_only_its_own_credential(
    shared_api: RunningApi, presented: Presented, family: Family, kind: Kind
) -> None:
    with shared_api.client() as client:
        response = _call(family, client, presented, kind)
    expected = EXPECTED[family][kind]
    if expected is None:
        _accepted(family, response)
    else:
        _refused(family, response, expected)
    # No secret presented comes back in any answer.
    value = presented.values[kind]
    if value is not None and kind is not Kind.OPERATOR:
        assert value.split(".")[-1] not in response.text


@pytest.mark.fast
def test_every_pair_is_covered() -> None:
    assert {(f, k) for f in EXPECTED for k in EXPECTED[f]} == set(CASES)
