"""Enrollment tokens over real HTTP: shown once, listed by state, revoked, labels carried."""

from __future__ import annotations

import uuid

from schemas.protocol import AUDIT
from tests.admin_helpers import (
    audit,
    enroll_with,
    get_node,
    new_token,
    ok,
    refused,
    token_id,
)
from tests.agent.harness import wait_until
from tests.api_server import RunningApi
from tests.flows import (
    TOKENS,
    create_token,
)

# --------------------------------------------------------------------------- tokens


def test_token_secret_is_shown_only_once(api: RunningApi) -> None:
    with api.client() as client:
        created = new_token(client, api, labels={"rack": "r1"}, note="for gpu-7")
        secret = created["secret"]
        assert secret.startswith("mfe.")
        info = created["token"]
        assert info["id"] == token_id(secret)
        assert info["state"] == "active"
        assert info["labels"] == {"rack": "r1"} and info["note"] == "for gpu-7"
        assert "secret" not in info
        secret_part = secret.split(".")[2]

        for state in (None, "active"):
            params = {"state": state} if state else None
            response = client.get(TOKENS, params=params, headers=api.admin_headers)
            listed = ok(response)["items"]
            assert [t["id"] for t in listed] == [info["id"]]
            assert secret_part not in response.text
            assert "secret" not in response.text
            assert "digest" not in response.text
        # Revoking answers with the token's info, never its secret.
        response = client.post(f"{TOKENS}/{info['id']}/revoke", headers=api.admin_headers)
        assert secret_part not in response.text
        # Nor does the audit log hold it.
        response = client.get(AUDIT, headers=api.admin_headers)
        assert ok(response)["items"] and secret_part not in response.text


def test_token_list_state_filter(api: RunningApi) -> None:
    with api.client() as client:
        expired = new_token(client, api, expires_in_s=1)["token"]["id"]
        active = new_token(client, api, expires_in_s=3600)["token"]["id"]
        forever = new_token(client, api)["token"]["id"]
        used_secret = create_token(client, api)
        used = token_id(used_secret)
        node = enroll_with(client, used_secret)
        revoked = new_token(client, api)["token"]["id"]
        ok(client.post(f"{TOKENS}/{revoked}/revoke", headers=api.admin_headers))

        def ids(state: str | None) -> list[str]:
            params = {"state": state} if state else None
            items = ok(client.get(TOKENS, params=params, headers=api.admin_headers))["items"]
            if state:
                assert all(item["state"] == state for item in items)
            return sorted(item["id"] for item in items)

        wait_until(lambda: ids("expired") == [expired], 10, "the one-second token expired")
        assert ids("active") == sorted([active, forever])
        assert ids("expired") == [expired]
        assert ids("used") == [used]
        assert ids("revoked") == [revoked]
        assert ids(None) == sorted([expired, active, forever, used, revoked])
        refused(
            client.get(TOKENS, params={"state": "bogus"}, headers=api.admin_headers),
            422,
            "validation_failed",
        )

        used_info = next(
            t for t in ok(client.get(TOKENS, headers=api.admin_headers))["items"] if t["id"] == used
        )
        assert used_info["used_by_node_id"] == node.node_id
        assert used_info["used_at"] is not None
        # Limit bounds the page.
        limited = ok(client.get(TOKENS, params={"limit": 2}, headers=api.admin_headers))
        assert len(limited["items"]) == 2


def test_token_revoke_idempotent_used_and_unknown(api: RunningApi) -> None:
    with api.client() as client:
        tid = new_token(client, api)["token"]["id"]
        first = ok(client.post(f"{TOKENS}/{tid}/revoke", headers=api.admin_headers))
        second = ok(client.post(f"{TOKENS}/{tid}/revoke", headers=api.admin_headers))
        assert first["state"] == second["state"] == "revoked"
        assert first["revoked_at"] == second["revoked_at"]
        # Idempotent in effect: one audit row, not two.
        assert len(audit(client, api, action="token.revoked", target_id=tid)) == 1

        used_secret = create_token(client, api)
        enroll_with(client, used_secret)
        used = token_id(used_secret)
        refused(
            client.post(f"{TOKENS}/{used}/revoke", headers=api.admin_headers), 409, "state_conflict"
        )
        listed = ok(client.get(TOKENS, params={"state": "used"}, headers=api.admin_headers))
        assert [t["id"] for t in listed["items"]] == [used]

        refused(
            client.post(f"{TOKENS}/{uuid.uuid4()}/revoke", headers=api.admin_headers),
            404,
            "not_found",
        )
        refused(
            client.post(f"{TOKENS}/not-a-uuid/revoke", headers=api.admin_headers),
            422,
            "validation_failed",
        )


def test_token_labels_and_display_name_land_on_node(api: RunningApi) -> None:
    with api.client() as client:
        secret = create_token(
            client, api, labels={"rack": "r7", "gpu": "h200"}, display_name="Rack 7 / slot 3"
        )
        node = enroll_with(client, secret, hostname="h200-07")
        view = get_node(client, api, node.node_id)
        assert view["labels"] == {"rack": "r7", "gpu": "h200"}
        assert view["display_name"] == "Rack 7 / slot 3"
        assert view["hostname"] == "h200-07"
        # Invalid labels are refused at token creation.
        response = client.post(
            TOKENS, json={"labels": {"bad key!": "v"}}, headers=api.admin_headers
        )
        refused(response, 422, "validation_failed")
