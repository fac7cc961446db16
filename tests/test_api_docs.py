"""/docs and /redoc work on an offline host, and Authorize works: every asset is the API's
own (api/docs.py), and every operation that authenticates names its security scheme
(api/deps.py, api/gateway/auth.py), whose header really is the one the route reads.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from api.app import create_app
from api.deps import NODE_BEARER, OPERATOR_KEY
from api.docs import DOCS, DOCS_ASSETS, REDOC
from api.gateway.auth import SERVICE_CLIENT_BEARER
from api.settings import ApiSettings
from schemas.protocol import (
    ADMIN_HEADER,
    ADMIN_PREFIX,
    AGENT_PREFIX,
    ENROLL,
    GATEWAY_MODELS,
    GATEWAY_PREFIX,
    HEARTBEAT,
    NODES,
    SERVICE_CLIENTS,
)
from tests.admin_helpers import ok, refused
from tests.api_server import OPERATOR_KEY as KEY
from tests.api_server import RunningApi
from tests.flows import enroll, heartbeat_body

OPERATOR = OPERATOR_KEY.scheme_name
NODE = NODE_BEARER.scheme_name
SERVICE_CLIENT = SERVICE_CLIENT_BEARER.scheme_name

_ASSET_TYPES = {
    ".js": ("text/javascript", "application/javascript"),
    ".css": ("text/css",),
    ".png": ("image/png",),
}


def _document() -> dict[str, Any]:
    # The document comes from the app itself; nothing is served for it.
    settings = ApiSettings(
        database_url="postgresql+asyncpg://unused/unused",
        nats_url="nats://unused:4222",
        operator_api_key=KEY,
    )
    document: dict[str, Any] = create_app(settings).openapi()
    return document


def _operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, operation)
        for path, methods in document["paths"].items()
        for method, operation in methods.items()
    ]


def _references(html: str) -> list[str]:
    return re.findall(r"""(?:src|href|url|spec-url)\s*[=:]\s*["']([^"']+)["']""", html)


@pytest.mark.fast
def test_every_authenticated_operation_names_its_scheme() -> None:
    document = _document()
    schemes = document["components"]["securitySchemes"]
    assert schemes[OPERATOR] == {
        "type": "apiKey",
        "in": "header",
        "name": ADMIN_HEADER,
        "description": schemes[OPERATOR]["description"],
    }
    assert schemes[NODE]["type"] == "http" and schemes[NODE]["scheme"] == "bearer"
    assert schemes[SERVICE_CLIENT]["type"] == "http"
    assert schemes[SERVICE_CLIENT]["scheme"] == "bearer"

    seen = {OPERATOR: 0, NODE: 0, SERVICE_CLIENT: 0}
    for method, path, operation in _operations(document):
        security = operation.get("security")
        where = f"{method} {path}"
        if path.startswith(ADMIN_PREFIX):
            expected: list[dict[str, list[str]]] | None = [{OPERATOR: []}]
        elif path.startswith(AGENT_PREFIX) and path != ENROLL:
            expected = [{NODE: []}]
        elif path.startswith(GATEWAY_PREFIX + "/"):
            expected = [{SERVICE_CLIENT: []}]
        else:
            # Enrollment (its token is in the body), health.
            expected = None
        assert security == expected, where
        for requirement in security or []:
            seen[next(iter(requirement))] += 1
        # The header is in the scheme now, not a parameter Authorize would not fill.
        headers = {
            p["name"].lower() for p in operation.get("parameters", []) if p["in"] == "header"
        }
        if expected is not None:
            assert not headers & {"authorization", ADMIN_HEADER.lower()}, where
    # Guard against an empty enumeration.
    assert seen[OPERATOR] >= 11 and seen[NODE] >= 10 and seen[SERVICE_CLIENT] >= 2, seen


@pytest.mark.parametrize("page", [DOCS, REDOC])
def test_docs_pages_use_only_local_assets(api: RunningApi, page: str) -> None:
    with api.client() as client:
        response = client.get(page)
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/html")
        html = response.text
        assert "http://" not in html and "https://" not in html and "//cdn" not in html
        references = _references(html)
        assets = [ref for ref in references if ref.startswith(DOCS_ASSETS + "/")]
        # The page's script and its favicon (Swagger UI: its stylesheet too), and the
        # document; nothing else.
        assert len(assets) == (3 if page == DOCS else 2), references
        assert set(references) - set(assets) == {"/openapi.json"}, references
        for asset in assets:
            served = client.get(asset)
            assert served.status_code == 200, asset
            suffix = asset[asset.rfind(".") :]
            content_type = served.headers["content-type"].split(";")[0]
            assert content_type in _ASSET_TYPES[suffix], (asset, content_type)
            assert len(served.content) > 1000, asset
        assert client.get("/openapi.json").status_code == 200


def test_each_scheme_authorizes_what_it_names(api: RunningApi) -> None:
    """What Swagger UI sends after Authorize, scheme by scheme, from the served document:
    admitted; and without it, the same refusal as ever (the error contract)."""
    with api.client() as client:
        schemes = ok(client.get("/openapi.json"))["components"]["securitySchemes"]
        operator = {schemes[OPERATOR]["name"]: KEY}
        ok(client.get(NODES, headers=operator))
        refused(client.get(NODES), 401, "admin_token_missing")
        refused(client.get(NODES, headers={ADMIN_HEADER: "wrong"}), 401, "admin_token_invalid")

        node = enroll(client, api)
        bearer = {"Authorization": f"{schemes[NODE]['scheme'].title()} {node.credential}"}
        ok(client.post(HEARTBEAT, json=heartbeat_body(node.node_id), headers=bearer))
        refused(
            client.post(HEARTBEAT, json=heartbeat_body(node.node_id)), 401, "credential_missing"
        )
        refused(
            client.post(HEARTBEAT, json={}, headers={"Authorization": node.credential}),
            401,
            "credential_malformed",
        )

        created = ok(
            client.post(
                SERVICE_CLIENTS, json={"name": "docs", "models": ["m"]}, headers=api.admin_headers
            ),
            201,
        )
        service = {"Authorization": f"{schemes[SERVICE_CLIENT]['scheme']} {created['secret']}"}
        ok(client.get(GATEWAY_MODELS, headers=service))
        # The gateway answers in OpenAI's error shape.
        for headers, code in (({}, "credential_missing"), (bearer, "credential_malformed")):
            response = client.get(GATEWAY_MODELS, headers=headers)
            assert response.status_code == 401
            assert response.json()["error"]["code"] == code


def test_no_cdn_page_is_left(api: RunningApi) -> None:
    """FastAPI's own pages (and their OAuth2 redirect) are off: nothing names a CDN."""
    with api.client() as client:
        assert client.get("/docs/oauth2-redirect").status_code == 404
        for page in (DOCS, REDOC):
            assert "cdn.jsdelivr.net" not in client.get(page).text
