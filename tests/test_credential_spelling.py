"""One secret, one spelling: `<prefix>.<32 lower-case hex>.<secret as issued>`, byte for
byte (issue 30).

uuid.UUID(hex=...) takes the id with dashes, in braces, as `urn:uuid:`, in upper case,
with a `+` or a space for a leading zero and with non-ASCII digits; `str.strip()` takes a
trailing NEL (U+0085). Each of those spellings of a live service client secret, node
credential and enrollment token was admitted. The parser (store/secrets.py) is checked
here as a table, and each kind over HTTP, on the route that takes it.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable

import httpx
import pytest

from schemas.protocol import (
    ENROLL,
    ENROLLMENT_TOKEN_PREFIX,
    GATEWAY_MODELS,
    HEARTBEAT,
    NODE_CREDENTIAL_PREFIX,
    SECRET_BYTES,
    SECRET_LENGTH,
    SERVICE_CLIENT_PREFIX,
    SERVICE_CLIENTS,
)
from store import secrets as wire_secrets
from tests.admin_helpers import ok
from tests.api_server import RunningApi
from tests.flows import create_token, enroll, enroll_body, heartbeat_body

PREFIXES = (NODE_CREDENTIAL_PREFIX, ENROLLMENT_TOKEN_PREFIX, SERVICE_CLIENT_PREFIX)
# An id with a leading zero, so that `+` and a space can stand for it.
ID = uuid.UUID("0123456789abcdef0123456789abcdef")
SECRET = "A" * (SECRET_LENGTH - 2) + "_-"


def _hostile(prefix: str, secret_id: uuid.UUID, secret: str) -> dict[str, str]:
    """Spellings that name the same id and secret but are not the issued one."""
    canonical = f"{prefix}.{secret_id.hex}.{secret}"
    spellings = {
        "dashes": f"{prefix}.{secret_id}.{secret}",
        "braces": f"{prefix}.{{{secret_id.hex}}}.{secret}",
        "urn": f"{prefix}.urn:uuid:{secret_id}.{secret}",
        "upper_id": f"{prefix}.{secret_id.hex.upper()}.{secret}",
        "nel_after": canonical + "\x85",
        "nel_before": "\x85" + canonical,
        "newline_after": canonical + "\n",
        "upper_prefix": canonical.replace(prefix, prefix.upper(), 1),
        # Arabic-Indic digits: int(..., 16) reads them as 0-9.
        "non_ascii_digit": canonical.replace(
            secret_id.hex, "".join(chr(0x660 + int(c)) if c.isdigit() else c for c in secret_id.hex)
        ),
    }
    if secret_id.hex.startswith("0"):
        rest = secret_id.hex[1:]
        spellings["plus_for_zero"] = f"{prefix}.+{rest}.{secret}"
        spellings["space_for_zero"] = f"{prefix}. {rest}.{secret}"
    return spellings


@pytest.mark.fast
def test_issued_secret_has_the_documented_length() -> None:
    assert len(secrets.token_urlsafe(SECRET_BYTES)) == SECRET_LENGTH
    issued = wire_secrets.issue(SERVICE_CLIENT_PREFIX)
    assert wire_secrets.parse(SERVICE_CLIENT_PREFIX, issued.wire) is not None


@pytest.mark.fast
@pytest.mark.parametrize("prefix", PREFIXES)
def test_parser_takes_only_the_issued_spelling(prefix: str) -> None:
    presented = wire_secrets.parse(prefix, f"{prefix}.{ID.hex}.{SECRET}")
    assert presented == wire_secrets.PresentedSecret(id=ID, secret=SECRET)
    refused = {
        name: spelling
        for name, spelling in _hostile(prefix, ID, SECRET).items()
        if wire_secrets.parse(prefix, spelling) is not None
    }
    assert refused == {}, f"admitted non-canonical spellings: {sorted(refused)}"
    # The secret part: the issued alphabet and length only.
    for secret in (SECRET[:-1], SECRET + "A", SECRET[:-1] + "=", SECRET[:-1] + "é", "A" * 100):
        assert wire_secrets.parse(prefix, f"{prefix}.{ID.hex}.{secret}") is None, secret
    other = next(p for p in PREFIXES if p != prefix)
    assert wire_secrets.parse(prefix, f"{other}.{ID.hex}.{SECRET}") is None


def _parts(wire: str) -> tuple[str, uuid.UUID, str]:
    prefix, hex_id, secret = wire.split(".")
    return prefix, uuid.UUID(hex=hex_id), secret


def _header_spellings(wire: str) -> dict[str, bytes]:
    # Header values travel as bytes; the server reads them as latin-1, so byte 0x85 is
    # U+0085 (NEL). Spellings a header cannot carry (a newline, non-latin-1) are left out.
    spellings = {}
    for name, spelling in _hostile(*_parts(wire)).items():
        try:
            encoded = spelling.encode("latin-1")
        except UnicodeEncodeError:
            continue
        if b"\n" not in encoded:
            spellings[name] = encoded
    return spellings


def _refused_each(
    call: Callable[[bytes], httpx.Response], wire: str, codes: set[str], envelope: bool = False
) -> None:
    admitted = {}
    for name, spelling in _header_spellings(wire).items():
        response = call(b"Bearer " + spelling)
        body = response.json()
        error = body.get("error", {}) if envelope else body
        if response.status_code != 401 or error.get("code") not in codes:
            admitted[name] = (response.status_code, error.get("code"))
    assert admitted == {}, admitted
    # The canonical spelling, after the scheme's 1*SP, is admitted.
    assert call(b"Bearer  " + wire.encode()).status_code == 200


def test_service_client_secret_has_one_spelling(shared_api: RunningApi) -> None:
    api = shared_api
    with api.client() as client:
        body = {"name": "spelling", "models": ["smollm2-135m"], "roles": ["chat"]}
        wire = ok(client.post(SERVICE_CLIENTS, json=body, headers=api.admin_headers), 201)["secret"]

        def call(authorization: bytes) -> httpx.Response:
            return client.get(GATEWAY_MODELS, headers={b"Authorization": authorization})

        _refused_each(call, wire, {"credential_malformed"}, envelope=True)


def test_node_credential_has_one_spelling(shared_api: RunningApi) -> None:
    api = shared_api
    with api.client() as client:
        node = enroll(client, api, hostname="spelling-host")
        # A first heartbeat caches the node, so the fast path (api/agent/fast_path.py)
        # is the one asked.
        ok(client.post(HEARTBEAT, json=heartbeat_body(node.node_id), headers=node.headers))

        def call(authorization: bytes) -> httpx.Response:
            return client.post(
                HEARTBEAT,
                json=heartbeat_body(node.node_id),
                headers={b"Authorization": authorization},
            )

        _refused_each(call, node.credential, {"credential_malformed"})


def test_enrollment_token_has_one_spelling(shared_api: RunningApi) -> None:
    api = shared_api
    with api.client() as client:
        token = create_token(client, api)
        admitted = {}
        for name, spelling in _hostile(*_parts(token)).items():
            response = client.post(ENROLL, json=enroll_body(spelling, hostname="spelling-enroll"))
            # A NEL or a newline is a control character, which no text field takes
            # (schemas/base.py): 422 before the token is looked at. Everything else is
            # not an enrollment token: 401.
            control = name.endswith(("_after", "_before"))
            expected = (422, "validation_failed") if control else (401, "enrollment_token_invalid")
            if (response.status_code, response.json().get("code")) != expected:
                admitted[name] = (response.status_code, response.json().get("code"))
        assert admitted == {}, admitted
        # None of them used the token: its one spelling still enrolls.
        enrolled = client.post(ENROLL, json=enroll_body(token, hostname="spelling-enroll"))
        assert enrolled.status_code == 201, enrolled.text
