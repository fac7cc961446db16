"""Authentication comes before validation, on every authenticated route (issue 30).

An unauthenticated caller learns nothing of a route's schema: every operation of the
OpenAPI document that names a security scheme is called with a missing, a malformed, a
wrong-kind or an unknown credential (the operator key on an agent route, a node
credential on an admin route, a service client's secret on an agent route, a forged
dashboard session cookie, ...), each together with a malformed path parameter, the
route's required headers left out, invalid query parameters, and a body that does not
validate, does not parse or is not UTF-8. Every answer is 401 with a refusal code of the
route's scheme, or 403 node_disabled for a disabled node's credential, never 422.
"""

from __future__ import annotations

import re
import secrets
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from schemas.protocol import (
    ADMIN_HEADER,
    ADMIN_PREFIX,
    AGENT_PREFIX,
    ENROLL,
    GATEWAY_PREFIX,
    NODES,
)
from schemas.ui import CSRF_HEADER, SESSION_COOKIE
from tests.admin_helpers import ok
from tests.api_server import OPERATOR_KEY, RunningApi
from tests.deployment_flows import live_and_revoked
from tests.flows import create_token, enroll

_PARAM = re.compile(r"\{([^}]+)\}")


@dataclass(frozen=True)
class Credential:
    name: str
    headers: dict[str, str]
    cookies: dict[str, str]
    # The refusal expected instead of the scheme's 401.
    refusal: tuple[int, str] | None = None


@dataclass(frozen=True)
class Known:
    node_credential: str
    disabled_node_credential: str
    service_secret: str
    revoked_service_secret: str
    enrollment_token: str


@pytest.fixture(scope="module")
def known(shared_api: RunningApi) -> Known:
    api = shared_api
    with api.client() as client:
        node = enroll(client, api, hostname="auth-first-host")
        disabled = enroll(client, api, hostname="auth-first-disabled")
        ok(
            client.patch(
                f"{NODES}/{disabled.node_id}", json={"enabled": False}, headers=api.admin_headers
            )
        )
        live, revoked = live_and_revoked(client, api, "auth-first")
        token = create_token(client, api)
    return Known(node.credential, disabled.credential, live, revoked, token)


def _bearer(name: str, value: str) -> Credential:
    return Credential(name, {"Authorization": f"Bearer {value}"}, {})


def _wrong_credentials(scheme: str, known: Known) -> list[Credential]:
    """What a caller without this scheme's credential might present."""
    unknown = secrets.token_urlsafe(32)
    common = [
        Credential("missing", {}, {}),
        Credential("not_bearer", {"Authorization": f"Basic {OPERATOR_KEY}"}, {}),
        _bearer("enrollment_token", known.enrollment_token),
    ]
    if scheme == "nodeBearer":
        return [
            *common,
            _bearer("malformed", "not-a-credential"),
            _bearer("operator_key", OPERATOR_KEY),
            Credential("operator_key_header", {ADMIN_HEADER: OPERATOR_KEY}, {}),
            _bearer("service_client", known.service_secret),
            _bearer("unknown_node", f"mfn.{uuid.uuid4().hex}.{unknown}"),
            # Authenticated, and refused for what it is: 403, never the 422.
            Credential(
                "disabled_node",
                {"Authorization": f"Bearer {known.disabled_node_credential}"},
                {},
                (403, "node_disabled"),
            ),
        ]
    if scheme == "serviceClientBearer":
        return [
            *common,
            _bearer("malformed", "not-a-credential"),
            _bearer("node_credential", known.node_credential),
            _bearer("operator_key", OPERATOR_KEY),
            Credential("operator_key_header", {ADMIN_HEADER: OPERATOR_KEY}, {}),
            _bearer("unknown_client", f"mfs.{uuid.uuid4().hex}.{unknown}"),
            _bearer("revoked_client", known.revoked_service_secret),
        ]
    assert scheme == "operatorKey", scheme
    return [
        *common,
        Credential("malformed", {ADMIN_HEADER: "not-the-key"}, {}),
        Credential("node_credential_header", {ADMIN_HEADER: known.node_credential}, {}),
        _bearer("node_credential", known.node_credential),
        _bearer("service_client", known.service_secret),
        _bearer("operator_key_as_bearer", OPERATOR_KEY),
        # The dashboard's cookie, forged: no session of ours signed it.
        Credential(
            "forged_session",
            {CSRF_HEADER: "forged"},
            {SESSION_COOKIE: "forged.session.cookie", "modelforge_csrf": "forged"},
        ),
    ]


@dataclass(frozen=True)
class Variant:
    name: str
    path: str
    params: dict[str, str]
    content: bytes | None
    content_type: str | None


_BODIES: list[tuple[str, bytes, str]] = [
    ("body_invalid", b'{"unexpected": [1, 2, 3]}', "application/json"),
    ("body_not_an_object", b"[]", "application/json"),
    ("body_unparseable", b'{"unclosed": ', "application/json"),
    ("body_utf16", '{"unexpected": 1}'.encode("utf-16"), "application/json"),
    ("body_wrong_media_type", b"<xml/>", "application/xml"),
]


def _variants(path: str, operation: dict[str, Any]) -> list[Variant]:
    names = _PARAM.findall(path)
    valid = _PARAM.sub(lambda m: "1" if m.group(1) == "seq" else str(uuid.uuid4()), path)
    malformed = _PARAM.sub("not%20an-id", path)
    query = {
        parameter["name"]: "\x00"
        for parameter in operation.get("parameters", [])
        if parameter["in"] == "query"
    }
    # Required headers (an invoke's lease, ...) are never sent.
    variants = [Variant("headers_missing", valid, {}, None, None)]
    if names:
        variants.append(Variant("path_malformed", malformed, {}, None, None))
    if query:
        variants.append(Variant("query_invalid", valid, query, None, None))
    if "requestBody" in operation or names:
        for name, content, media in _BODIES:
            variants.append(Variant(name, malformed if names else valid, query, content, media))
    return variants


# The refusal codes of each scheme (schemas/errors.py).
CODES = {
    "nodeBearer": {"credential_missing", "credential_malformed", "credential_invalid"},
    "serviceClientBearer": {
        "credential_missing",
        "credential_malformed",
        "credential_invalid",
        "credential_revoked",
    },
    "operatorKey": {"admin_token_missing", "admin_token_invalid"},
}


def _code(response: httpx.Response) -> str | None:
    try:
        body = response.json()
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    error = body.get("error", body)
    return error.get("code") if isinstance(error, dict) else None


def test_no_route_validates_before_it_authenticates(shared_api: RunningApi, known: Known) -> None:
    with shared_api.client() as client:
        document = ok(client.get("/openapi.json"))
        operations = [
            (method.upper(), path, operation)
            for path, item in document["paths"].items()
            for method, operation in item.items()
            if operation.get("security")
        ]
        schemes = {next(iter(s)) for _, _, op in operations for s in op["security"]}
        # Every route of the three APIs names its scheme (enrollment's token is its body).
        unsecured = [
            f"{method} {path}"
            for path, item in document["paths"].items()
            for method, operation in item.items()
            if path.startswith((ADMIN_PREFIX, AGENT_PREFIX, GATEWAY_PREFIX))
            and path != ENROLL
            and not operation.get("security")
        ]
        assert unsecured == []
        assert schemes == set(CODES), schemes
        asked = 0
        wrong: list[str] = []
        statuses: Counter[int] = Counter()
        for method, path, operation in operations:
            (scheme,) = {next(iter(s)) for s in operation["security"]}
            for credential in _wrong_credentials(scheme, known):
                for variant in _variants(path, operation):
                    headers = dict(credential.headers)
                    if variant.content_type is not None:
                        headers["Content-Type"] = variant.content_type
                    client.cookies.clear()
                    client.cookies.update(credential.cookies)
                    response = client.request(
                        method,
                        variant.path,
                        params=variant.params,
                        content=variant.content,
                        headers=headers,
                    )
                    asked += 1
                    statuses[response.status_code] += 1
                    code = _code(response)
                    status, codes = (
                        (credential.refusal[0], {credential.refusal[1]})
                        if credential.refusal
                        else (401, CODES[scheme])
                    )
                    if (
                        response.status_code != status
                        or code not in codes
                        or not response.headers.get("X-Correlation-ID")
                    ):
                        wrong.append(
                            f"{method} {path} [{credential.name}, {variant.name}]: "
                            f"{response.status_code} {code}"
                        )
        client.cookies.clear()
    assert asked > 1000, asked
    assert not wrong, f"{len(wrong)} of {asked} ({dict(statuses)}):\n" + "\n".join(wrong)
