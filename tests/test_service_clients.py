"""Service clients over real HTTP and real PostgreSQL: the secret is shown once and only
its digest is kept, rotation retires the old secret at once, revocation is refused by
every API process from its next call. Authentication is the gateway's own function
(api/gateway/auth.py), run inside an API process on that process's sessions; the HTTP
matrix over route families is tests/test_credential_matrix.py."""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import Coroutine
from typing import Any, TypeVar

import httpx
import pytest

from api.errors import ApiError
from api.gateway.auth import client_scope
from api.gateway.scope import ClientScope
from schemas.events import OPERATOR_ACTOR
from schemas.protocol import (
    AUDIT,
    GATEWAY_MODELS,
    SERVICE_CLIENT_PREFIX,
    SERVICE_CLIENTS,
    secret_pattern,
)
from schemas.service_clients import ServiceClientCreate
from store import secrets
from store.deployments import service_clients
from store.deployments.service_clients import IssuedClient
from store.errors import StoreError
from store.secrets import PresentedSecret
from tests.admin_helpers import audit, db_scalar, ok, refused
from tests.agent.harness import wait_until
from tests.api_server import OPERATOR_KEY, ApiFactory, RunningApi
from tests.flows import enroll

T = TypeVar("T")


def on_api(api: RunningApi, make: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine inside the API process's own event loop (its engine lives there)."""
    loop = api.server.servers[0].get_loop()
    return asyncio.run_coroutine_threadsafe(make, loop).result(timeout=15)


def authenticate(api: RunningApi, authorization: str | None) -> ClientScope | str:
    """What the gateway of this API process makes of the header (its cache, else the
    database): the client's scope, or the code it refuses with."""

    async def call() -> ClientScope | str:
        try:
            return await client_scope(api.state, authorization)
        except (ApiError, StoreError) as refusal:  # the header's, or the database's
            return refusal.code.value

    return on_api(api, call())


def bearer(secret: str) -> str:
    return f"Bearer {secret}"


def new_client(client: httpx.Client, api: RunningApi, **body: Any) -> dict[str, Any]:
    created: dict[str, Any] = ok(
        client.post(
            SERVICE_CLIENTS,
            json={"name": "chat-frontend", "models": ["smollm2-135m"], **body},
            headers=api.admin_headers,
        ),
        201,
    )
    return created


def secret_part(secret: str) -> str:
    return secret.split(".")[2]


def row_json(api: RunningApi, client_id: str) -> str:
    text: str = db_scalar(
        api.settings.database_url,
        "SELECT row_to_json(c)::text FROM service_clients c WHERE id = :id",
        id=uuid.UUID(client_id),
    )
    return text


def test_secret_is_shown_once_and_only_its_digest_is_stored(api: RunningApi) -> None:
    with api.client() as client:
        created = new_client(
            client,
            api,
            roles=["chat"],
            max_concurrent=4,
            rate_per_minute=120,
        )
        secret = created["secret"]
        match = secret_pattern(SERVICE_CLIENT_PREFIX).match(secret)
        assert match, secret
        assert str(uuid.UUID(hex=match.group(1))) == created["id"]
        assert created["state"] == "active"
        assert created["models"] == ["smollm2-135m"] and created["roles"] == ["chat"]
        assert created["max_concurrent"] == 4 and created["rate_per_minute"] == 120
        assert created["rotated_at"] is None and created["revoked_at"] is None

        for response in (
            client.get(SERVICE_CLIENTS, headers=api.admin_headers),
            client.get(SERVICE_CLIENTS, params={"state": "active"}, headers=api.admin_headers),
            client.get(f"{SERVICE_CLIENTS}/{created['id']}", headers=api.admin_headers),
        ):
            ok(response)
            assert secret_part(secret) not in response.text
            assert "secret" not in response.text and "digest" not in response.text
        view = ok(client.get(f"{SERVICE_CLIENTS}/{created['id']}", headers=api.admin_headers))
        assert view == {k: v for k, v in created.items() if k != "secret"}

        # The row holds the digest of the secret, and the secret in no column.
        row = row_json(api, created["id"])
        assert secret_part(secret) not in row and secret not in row
        stored = db_scalar(
            api.settings.database_url,
            "SELECT digest FROM service_clients WHERE id = :id",
            id=uuid.UUID(created["id"]),
        )
        assert bytes(stored) == hashlib.sha256(secret_part(secret).encode()).digest()

        # One event, audited, without the secret.
        events = audit(client, api, action="service_client.created", target_id=created["id"])
        assert len(events) == 1
        response = client.get(AUDIT, params={"limit": 1000}, headers=api.admin_headers)
        assert secret_part(secret) not in response.text

        scope = authenticate(api, bearer(secret))
        assert scope == ClientScope(
            client_id=uuid.UUID(created["id"]),
            name="chat-frontend",
            models=frozenset({"smollm2-135m"}),
            roles=frozenset({"chat"}),
            max_concurrent=4,
            rate_per_minute=120,
        )


def test_create_is_validated(api: RunningApi) -> None:
    with api.client() as client:
        for body in (
            {"name": "unscoped"},
            {"name": "unscoped", "models": [], "roles": []},
            {"name": "x", "models": ["m"], "secret": "mine"},
            {"name": "x", "models": ["m"], "max_concurrent": 0},
            {"name": "x", "models": ["m"], "rate_per_minute": "60"},
            {"name": "x", "models": ["../etc"]},
        ):
            refused(
                client.post(SERVICE_CLIENTS, json=body, headers=api.admin_headers),
                422,
                "validation_failed",
            )
        assert ok(client.get(SERVICE_CLIENTS, headers=api.admin_headers))["items"] == []


def test_list_is_newest_first_with_a_state_filter(api: RunningApi) -> None:
    with api.client() as client:
        ids = [new_client(client, api, name=f"svc-{i}")["id"] for i in range(3)]
        ok(client.post(f"{SERVICE_CLIENTS}/{ids[1]}/revoke", headers=api.admin_headers))

        def listed(**params: Any) -> list[str]:
            body = ok(client.get(SERVICE_CLIENTS, params=params, headers=api.admin_headers))
            return [item["id"] for item in body["items"]]

        assert listed() == ids[::-1]
        assert listed(state="active") == [ids[2], ids[0]]
        assert listed(state="revoked") == [ids[1]]
        assert listed(limit=1) == [ids[2]]
        refused(
            client.get(SERVICE_CLIENTS, params={"state": "bogus"}, headers=api.admin_headers),
            422,
            "validation_failed",
        )


def test_unknown_and_malformed_ids(api: RunningApi) -> None:
    with api.client() as client:
        unknown = uuid.uuid4()
        for response in (
            client.get(f"{SERVICE_CLIENTS}/{unknown}", headers=api.admin_headers),
            client.post(f"{SERVICE_CLIENTS}/{unknown}/rotate", headers=api.admin_headers),
            client.post(f"{SERVICE_CLIENTS}/{unknown}/revoke", headers=api.admin_headers),
        ):
            refused(response, 404, "not_found")
        refused(
            client.get(f"{SERVICE_CLIENTS}/not-a-uuid", headers=api.admin_headers),
            422,
            "validation_failed",
        )
        # Without the operator key, nothing (the admin router's check).
        refused(client.get(SERVICE_CLIENTS), 401, "admin_token_missing")
        refused(
            client.post(SERVICE_CLIENTS, json={"name": "x", "models": ["m"]}),
            401,
            "admin_token_missing",
        )


def test_rotation_retires_the_old_secret_at_once(api: RunningApi) -> None:
    with api.client() as client:
        created = new_client(client, api)
        old = created["secret"]
        assert isinstance(authenticate(api, bearer(old)), ClientScope)

        rotated = ok(
            client.post(f"{SERVICE_CLIENTS}/{created['id']}/rotate", headers=api.admin_headers)
        )
        new = rotated["secret"]
        assert new != old and rotated["id"] == created["id"]
        assert new.split(".")[1] == old.split(".")[1]  # the id stays the client's
        assert rotated["rotated_at"] is not None and rotated["state"] == "active"
        assert authenticate(api, bearer(old)) == "credential_invalid"
        scope = authenticate(api, bearer(new))
        assert isinstance(scope, ClientScope) and str(scope.client_id) == created["id"]

        view = ok(client.get(f"{SERVICE_CLIENTS}/{created['id']}", headers=api.admin_headers))
        assert view["rotated_at"] == rotated["rotated_at"] and "secret" not in view
        row = row_json(api, created["id"])
        assert secret_part(new) not in row and secret_part(old) not in row
        events = audit(client, api, action="service_client.rotated", target_id=created["id"])
        assert len(events) == 1
        response = client.get(AUDIT, params={"limit": 1000}, headers=api.admin_headers)
        assert secret_part(new) not in response.text

        # A revoked client is never given a new secret.
        ok(client.post(f"{SERVICE_CLIENTS}/{created['id']}/revoke", headers=api.admin_headers))
        refused(
            client.post(f"{SERVICE_CLIENTS}/{created['id']}/rotate", headers=api.admin_headers),
            409,
            "state_conflict",
        )
        assert authenticate(api, bearer(new)) == "credential_revoked"


def test_the_store_issues_the_secret_and_keeps_only_its_digest(api: RunningApi) -> None:
    """Issuing is the store's rule (store/deployments/service_clients.py), as for
    enrollment tokens and node credentials: create and rotate each hand back the secret to
    show once; a rotation keeps the client's id and retires the old secret."""

    async def create_then_rotate() -> tuple[IssuedClient, IssuedClient]:
        body = ServiceClientCreate(name="store-issued", models=["smollm2-135m"])
        async with api.state.sessions() as session, session.begin():
            created = await service_clients.create(session, body, actor=OPERATOR_ACTOR)
        async with api.state.sessions() as session, session.begin():
            rotated = await service_clients.rotate(session, created.client.id, actor=OPERATOR_ACTOR)
        return created, rotated

    created, rotated = on_api(api, create_then_rotate())
    match = secret_pattern(SERVICE_CLIENT_PREFIX).fullmatch(created.secret)
    assert match and uuid.UUID(hex=match.group(1)) == created.client.id
    assert rotated.client.id == created.client.id and rotated.secret != created.secret
    assert rotated.secret.split(".")[1] == created.secret.split(".")[1]
    stored = db_scalar(
        api.settings.database_url,
        "SELECT digest FROM service_clients WHERE id = :id",
        id=created.client.id,
    )
    assert bytes(stored) == hashlib.sha256(secret_part(rotated.secret).encode()).digest()
    assert authenticate(api, bearer(created.secret)) == "credential_invalid"
    scope = authenticate(api, bearer(rotated.secret))
    assert isinstance(scope, ClientScope) and scope.client_id == created.client.id


def test_revoke(api: RunningApi) -> None:
    with api.client() as client:
        created = new_client(client, api)
        other = new_client(client, api, name="other")
        revoked = ok(
            client.post(f"{SERVICE_CLIENTS}/{created['id']}/revoke", headers=api.admin_headers)
        )
        assert revoked["state"] == "revoked" and revoked["revoked_at"] is not None
        assert "secret" not in revoked
        assert authenticate(api, bearer(created["secret"])) == "credential_revoked"
        # Revoking again is refused, and the first revocation stands.
        refused(
            client.post(f"{SERVICE_CLIENTS}/{created['id']}/revoke", headers=api.admin_headers),
            409,
            "state_conflict",
        )
        view = ok(client.get(f"{SERVICE_CLIENTS}/{created['id']}", headers=api.admin_headers))
        assert view["revoked_at"] == revoked["revoked_at"]
        assert (
            len(audit(client, api, action="service_client.revoked", target_id=created["id"])) == 1
        )
        # Another client is untouched.
        assert isinstance(authenticate(api, bearer(other["secret"])), ClientScope)


def test_what_is_not_a_live_service_client_is_refused(api: RunningApi) -> None:
    with api.client() as client:
        created = new_client(client, api)
        node = enroll(client, api)
    secret = created["secret"]
    prefix, hex_id, part = secret.split(".")
    wrong = part[:-1] + ("A" if part[-1] != "A" else "B")
    cases = {
        None: "credential_missing",
        "": "credential_missing",
        secret: "credential_malformed",  # no scheme
        f"Basic {secret}": "credential_malformed",
        "Bearer ": "credential_malformed",
        bearer(node.credential): "credential_malformed",
        bearer(OPERATOR_KEY): "credential_malformed",
        bearer(f"{prefix}.{hex_id}"): "credential_malformed",
        bearer(f"{prefix}.not-hex.{part}"): "credential_malformed",
        bearer(f"{prefix}.{hex_id}.{wrong}"): "credential_invalid",
        bearer(f"{prefix}.{uuid.uuid4().hex}.{part}"): "credential_invalid",
        f"bearer {secret}": None,  # the scheme is case-insensitive
    }
    for header, code in cases.items():
        outcome = authenticate(api, header)
        if code is None:
            assert isinstance(outcome, ClientScope), (header, outcome)
        else:
            assert outcome == code, (header, outcome)


def test_a_second_api_process_refuses_a_revocation_within_a_second(
    api_factory: ApiFactory,
) -> None:
    first, second = api_factory(), api_factory()
    with first.client() as client:
        created = new_client(client, first)
        kept = new_client(client, first, name="kept")
        rotating = new_client(client, first, name="rotating")
        # The second process has already admitted them (nothing it might have kept).
        for one in (created, kept, rotating):
            assert isinstance(authenticate(second, bearer(one["secret"])), ClientScope)

        ok(client.post(f"{SERVICE_CLIENTS}/{created['id']}/revoke", headers=first.admin_headers))
        rotated = ok(
            client.post(f"{SERVICE_CLIENTS}/{rotating['id']}/rotate", headers=first.admin_headers)
        )
        answered = time.monotonic()
        wait_until(
            lambda: authenticate(second, bearer(created["secret"])) == "credential_revoked",
            1.0,
            "the second API process refusing the revoked client",
        )
        wait_until(
            lambda: authenticate(second, bearer(rotating["secret"])) == "credential_invalid",
            1.0,
            "the second API process refusing the rotated-out secret",
        )
        assert time.monotonic() - answered < 1.0
        assert isinstance(authenticate(second, bearer(rotated["secret"])), ClientScope)
        assert isinstance(authenticate(second, bearer(kept["secret"])), ClientScope)


def test_the_process_that_rotates_or_revokes_refuses_the_old_secret_without_its_notify(
    api: RunningApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway remembers admitted clients (api/gateway/cache.py). With every gateway
    NOTIFY held back, the process that rotated or revoked a client still refuses the old
    secret from its very next call: it drops the client right after its own commit."""
    cache = api.state.gateway_cache
    held: list[str] = []
    monkeypatch.setattr(cache, "_on_payload", held.append)
    with api.client() as client:
        rotating = new_client(client, api, name="rotating")
        revoking = new_client(client, api, name="revoking")
        for one in (rotating, revoking):
            assert isinstance(authenticate(api, bearer(one["secret"])), ClientScope)
            # Remembered: the next call is answered from the cache.
            assert cache.client(parse(one["secret"])) is not None

        rotated = ok(
            client.post(f"{SERVICE_CLIENTS}/{rotating['id']}/rotate", headers=api.admin_headers)
        )
        ok(client.post(f"{SERVICE_CLIENTS}/{revoking['id']}/revoke", headers=api.admin_headers))
        assert authenticate(api, bearer(rotating["secret"])) == "credential_invalid"
        assert authenticate(api, bearer(revoking["secret"])) == "credential_revoked"
        assert isinstance(authenticate(api, bearer(rotated["secret"])), ClientScope)
        # The gateway's own route says the same.
        models = client.get(GATEWAY_MODELS, headers={"Authorization": bearer(revoking["secret"])})
        assert models.status_code == 401
        assert models.json()["error"]["code"] == "credential_revoked"
    assert any(payload == f"c:{revoking['id']}" for payload in held)


def parse(secret: str) -> PresentedSecret:
    presented = secrets.parse(SERVICE_CLIENT_PREFIX, secret)
    assert presented is not None
    return presented
