"""A body that is not UTF-8 is 422 `body_unparseable`, on every route (issue 30).

json.loads sniffs the encoding of bytes, so FastAPI's body reader and the fleet's fast
path took UTF-16 and UTF-32 (with or without a byte order mark) and UTF-8 with a BOM:
such a body created a service client, enrolled a node, was heard as a heartbeat and
reached the gateway's routing. Latin-1 was already refused; it stays so. Each is sent
here, with a valid credential, to an admin route, enrollment, the heartbeat of a node
the fast path answers, and /v1/chat/completions (OpenAI's envelope): 422
body_unparseable each time, and nothing was created.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from schemas.protocol import ENROLL, GATEWAY_CHAT_COMPLETIONS, HEARTBEAT, SERVICE_CLIENTS
from tests.admin_helpers import ok
from tests.api_processes import cached, fast
from tests.api_server import RunningApi
from tests.flows import create_token, enroll, enroll_body, heartbeat_body

ENCODINGS: dict[str, Any] = {
    "utf-16-le-bom": lambda text: "\ufeff".encode("utf-16-le") + text.encode("utf-16-le"),
    "utf-16-be-bom": lambda text: "\ufeff".encode("utf-16-be") + text.encode("utf-16-be"),
    "utf-16-le": lambda text: text.encode("utf-16-le"),
    "utf-32": lambda text: text.encode("utf-32"),
    "utf-32-be": lambda text: text.encode("utf-32-be"),
    "utf-8-bom": lambda text: text.encode("utf-8-sig"),
    "latin-1": lambda text: text.encode("latin-1"),
}
JSON = {"Content-Type": "application/json"}


def _encoded(body: dict[str, Any], encoding: str) -> bytes:
    encoded: bytes = ENCODINGS[encoding](json.dumps(body, ensure_ascii=False))
    return encoded


def _unparseable(response: httpx.Response, envelope: bool = False) -> None:
    assert response.status_code == 422, response.text
    body = response.json()
    error = body["error"] if envelope else body
    assert error["code"] == "body_unparseable", body
    assert error["correlation_id"] == response.headers["X-Correlation-ID"]


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_an_admin_route_refuses_a_body_that_is_not_utf8(
    shared_api: RunningApi, encoding: str
) -> None:
    api = shared_api
    name = f"utf8-{encoding}-é"
    body = {"name": name, "models": ["smollm2-135m"], "roles": ["chat"]}
    with api.client() as client:
        response = client.post(
            SERVICE_CLIENTS, content=_encoded(body, encoding), headers=api.admin_headers | JSON
        )
        _unparseable(response)
        listed = ok(client.get(SERVICE_CLIENTS, headers=api.admin_headers))["items"]
        assert name not in {item["name"] for item in listed}


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_enrollment_refuses_a_body_that_is_not_utf8(shared_api: RunningApi, encoding: str) -> None:
    api = shared_api
    with api.client() as client:
        token = create_token(client, api)
        body = enroll_body(token, hostname=f"utf8-{encoding}-é")
        _unparseable(client.post(ENROLL, content=_encoded(body, encoding), headers=JSON))
        # The token was not used: the same body in UTF-8 enrolls.
        assert client.post(ENROLL, json=body).status_code == 201


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_the_fast_path_refuses_a_heartbeat_that_is_not_utf8(
    shared_api: RunningApi, encoding: str
) -> None:
    api = shared_api
    with api.client() as client:
        node = enroll(client, api, hostname=f"utf8-beat-{encoding}")
        cached(client, node)
        declined = fast(client, HEARTBEAT, "declined")
        body = heartbeat_body(node.node_id, agent_version="1.0.0-é")
        response = client.post(
            HEARTBEAT, content=_encoded(body, encoding), headers=node.headers | JSON
        )
        _unparseable(response)
        # Not answered by the fast path: handed to the documented route, which refused.
        assert fast(client, HEARTBEAT, "declined") == declined + 1


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_the_gateway_refuses_a_body_that_is_not_utf8(shared_api: RunningApi, encoding: str) -> None:
    api = shared_api
    with api.client() as client:
        created = ok(
            client.post(
                SERVICE_CLIENTS,
                json={"name": f"utf8-gw-{encoding}", "models": ["smollm2-135m"]},
                headers=api.admin_headers,
            ),
            201,
        )
        body = {"model": "smollm2-135m", "messages": [{"role": "user", "content": "héllo"}]}
        response = client.post(
            GATEWAY_CHAT_COMPLETIONS,
            content=_encoded(body, encoding),
            headers={"Authorization": f"Bearer {created['secret']}"} | JSON,
        )
        _unparseable(response, envelope=True)
