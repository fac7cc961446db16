"""Every refusal on /v1 is in OpenAI's envelope, whoever refuses: the body-limit
middleware (413), the credential check (401), the router (404 for an unknown path, 405),
the validation (422) and the gateway's own answers (403, 404, 429, 503). OpenAI's
clients read `error.message` and nothing else; each answer carries the correlation id,
in the header and in the envelope."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from api.middleware.correlation import CorrelationIdMiddleware
from schemas.protocol import (
    CORRELATION_HEADER,
    DEPLOYMENTS,
    GATEWAY_CHAT_COMPLETIONS,
    GATEWAY_MODELS,
)
from tests.api_server import ApiFactory, RunningApi
from tests.deployment_flows import ready_deployment, service_client

CHAT = {"model": "smol", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
MAX_BODY = 4096


@pytest.fixture
def gateway_api(api_factory: ApiFactory) -> RunningApi:
    return api_factory(max_body_bytes=MAX_BODY, gateway_first_token_timeout_s=5)


def envelope(response: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    """The envelope's `error`, checked for OpenAI's shape and our correlation id."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert {"message", "type", "param", "code"} <= set(error), error
    assert isinstance(error["message"], str) and error["message"]
    assert error["type"] in ("invalid_request_error", "server_error")
    assert error["param"] is None or isinstance(error["param"], str)
    assert isinstance(error["code"], str) and error["code"]
    if code is not None:
        assert error["code"] == code, error
    correlation_id = response.headers[CORRELATION_HEADER]
    assert correlation_id and error["correlation_id"] == correlation_id
    return error


def test_a_body_over_the_limit_is_refused_in_the_envelope(gateway_api: RunningApi) -> None:
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * (MAX_BODY * 2)}]}
    auth = {"Authorization": "Bearer mfs.00000000000000000000000000000000.x"}
    with gateway_api.client() as client:
        declared = client.post(GATEWAY_CHAT_COMPLETIONS, json=big, headers=auth)
        # No Content-Length: the middleware counts what arrives.
        chunked = client.post(
            GATEWAY_CHAT_COMPLETIONS,
            content=iter([b'{"model": "', b"x" * (MAX_BODY * 2), b'"}']),
            headers={**auth, "Content-Type": "application/json"},
        )
        admin = client.post(
            DEPLOYMENTS, content=b"x" * (MAX_BODY * 2), headers=gateway_api.admin_headers
        )
    envelope(declared, 413, "body_too_large")
    envelope(chunked, 413, "body_too_large")
    # The admin API keeps ModelForge's own shape.
    assert admin.status_code == 413 and admin.json()["code"] == "body_too_large"
    assert admin.json()["correlation_id"] == admin.headers[CORRELATION_HEADER]


def test_the_routers_and_the_validations_refusals_are_in_the_envelope(
    gateway_api: RunningApi,
) -> None:
    with gateway_api.client() as client:
        ready_deployment(client, gateway_api)
        secret = service_client(client, gateway_api, models=["smol", "nobody-serves"])
        auth = {"Authorization": f"Bearer {secret}"}
        missing = client.post(GATEWAY_CHAT_COMPLETIONS, json=CHAT)
        wrong = client.get(GATEWAY_MODELS, headers={"Authorization": "Bearer nonsense"})
        unknown = client.get("/v1/nope", headers=auth)
        bare = client.get("/v1", headers=auth)
        method = client.get(GATEWAY_CHAT_COMPLETIONS, headers=auth)
        lax = client.post(GATEWAY_CHAT_COMPLETIONS, json={**CHAT, "n": True}, headers=auth)
        unparseable = client.post(
            GATEWAY_CHAT_COMPLETIONS,
            content=b'{"model": ',
            headers={**auth, "Content-Type": "application/json"},
        )
        nobody = client.post(
            GATEWAY_CHAT_COMPLETIONS, json={**CHAT, "model": "nobody-serves"}, headers=auth
        )
    envelope(missing, 401)
    envelope(wrong, 401)
    envelope(unknown, 404, "not_found")
    envelope(bare, 404, "not_found")
    envelope(method, 405, "method_not_allowed")
    assert "POST" in method.headers["Allow"]
    error = envelope(lax, 422, "validation_failed")
    # OpenAI names the offending field in `param`.
    assert error["param"] == "n"
    envelope(unparseable, 422, "body_unparseable")
    envelope(nobody, 404, "model_not_found")


def test_the_gateways_own_refusals_are_in_the_envelope(gateway_api: RunningApi) -> None:
    with gateway_api.client() as client:
        ready_deployment(client, gateway_api)
        limited = service_client(client, gateway_api, rate_per_minute=1)
        narrow = service_client(client, gateway_api, models=["other"], roles=[])
        auth = {"Authorization": f"Bearer {limited}"}
        # The deployment's node holds no runtime channel: none can take it.
        unready = client.post(GATEWAY_CHAT_COMPLETIONS, json=CHAT, headers=auth)
        limited_out = client.post(GATEWAY_CHAT_COMPLETIONS, json=CHAT, headers=auth)
        outside = client.post(
            GATEWAY_CHAT_COMPLETIONS, json=CHAT, headers={"Authorization": f"Bearer {narrow}"}
        )
    envelope(unready, 503, "no_ready_deployment")
    assert int(unready.headers["Retry-After"]) >= 1
    envelope(limited_out, 429, "rate_limited")
    assert int(limited_out.headers["Retry-After"]) >= 1
    envelope(outside, 403, "model_not_allowed")


@pytest.mark.fast
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/v1/admin/deployments"])
async def test_an_unhandled_error_is_a_500_in_the_shape_of_its_api(path: str) -> None:
    """The outermost middleware answers what nothing else did (a bug): on /v1 in the
    envelope too, never with a trace."""

    async def broken(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("a bug")

    app = CorrelationIdMiddleware(broken)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        response = await client.get(path)
    if path.startswith("/v1"):
        assert envelope(response, 500, "internal_error")["type"] == "server_error"
    else:
        assert response.status_code == 500
        assert response.json()["code"] == "internal_error"
        assert response.json()["correlation_id"] == response.headers[CORRELATION_HEADER]
