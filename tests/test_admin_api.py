"""The administrative API over real HTTP: tokens, nodes, credentials, decommission, recovery,
liveness on read, fail-closed operator auth and the audit log."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import NullPool, text
from sqlalchemy.ext.asyncio import create_async_engine

from tests.api_server import OPERATOR_KEY, RunningApi
from tests.flows import (
    ENROLL,
    HEARTBEAT,
    INVENTORY,
    NODES,
    TELEMETRY,
    TOKENS,
    EnrolledNode,
    create_token,
    enroll,
    enroll_body,
    gpu,
    heartbeat_body,
    inventory_body,
    now,
    telemetry_body,
)
from tests.services import run_async

AUDIT = "/api/v1/admin/audit"
ApiFactory = Callable[..., RunningApi]


# --------------------------------------------------------------------------- helpers


def ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, f"{response.status_code}: {response.text}"
    assert response.headers.get("X-Correlation-ID")
    return response.json()


def refused(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, f"{response.status_code}: {response.text}"
    body: dict[str, Any] = response.json()
    assert body["code"] == code, body
    assert body["correlation_id"] == response.headers["X-Correlation-ID"]
    return body


def credential_id(credential: str) -> str:
    return str(uuid.UUID(hex=credential.split(".")[1]))


def token_id(secret: str) -> str:
    return str(uuid.UUID(hex=secret.split(".")[1]))


def new_token(client: httpx.Client, api: RunningApi, **body: Any) -> dict[str, Any]:
    created: dict[str, Any] = ok(client.post(TOKENS, json=body, headers=api.admin_headers), 201)
    return created


def enroll_with(
    client: httpx.Client, token: str, hostname: str = "gpu-host-1", **extra: Any
) -> EnrolledNode:
    data = ok(client.post(ENROLL, json=enroll_body(token, hostname, **extra)), 201)
    return EnrolledNode(node_id=data["node_id"], credential=data["credential"])


def get_node(client: httpx.Client, api: RunningApi, node_id: str) -> dict[str, Any]:
    node: dict[str, Any] = ok(client.get(f"{NODES}/{node_id}", headers=api.admin_headers))
    return node


def patch_node(client: httpx.Client, api: RunningApi, node_id: str, **body: Any) -> httpx.Response:
    return client.patch(f"{NODES}/{node_id}", json=body, headers=api.admin_headers)


def list_nodes(client: httpx.Client, api: RunningApi, params: Any = None) -> list[str]:
    items = ok(client.get(NODES, params=params, headers=api.admin_headers))["items"]
    return sorted(item["id"] for item in items)


def beat(client: httpx.Client, node: EnrolledNode, **extra: Any) -> httpx.Response:
    return client.post(HEARTBEAT, json=heartbeat_body(node.node_id, **extra), headers=node.headers)


def audit(client: httpx.Client, api: RunningApi, **params: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = ok(
        client.get(AUDIT, params={"limit": 1000, **params}, headers=api.admin_headers)
    )["items"]
    return items


def decommission(
    client: httpx.Client, api: RunningApi, node_id: str, confirm: str | None = None
) -> httpx.Response:
    return client.post(
        f"{NODES}/{node_id}/decommission",
        json={"confirm_node_id": confirm or node_id, "reason": "hardware retired"},
        headers=api.admin_headers,
    )


def db_scalar(database_url: str, sql: str, **params: Any) -> Any:
    """Read the database directly (outbox rows have no HTTP view)."""

    async def query() -> Any:
        engine = create_async_engine(database_url, poolclass=NullPool)
        try:
            async with engine.connect() as conn:
                return (await conn.execute(text(sql), params)).scalar_one()
        finally:
            await engine.dispose()

    return run_async(query)


def outbox_count(database_url: str) -> int:
    count: int = db_scalar(database_url, "SELECT count(*) FROM outbox")
    return count


def audit_count(client: httpx.Client, api: RunningApi) -> int:
    return len(audit(client, api))


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
        time.sleep(1.2)

        def ids(state: str | None) -> list[str]:
            params = {"state": state} if state else None
            items = ok(client.get(TOKENS, params=params, headers=api.admin_headers))["items"]
            if state:
                assert all(item["state"] == state for item in items)
            return sorted(item["id"] for item in items)

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


# --------------------------------------------------------------------------- nodes


def test_node_list_filters(api: RunningApi) -> None:
    with api.client() as client:
        online = enroll(client, api, "online", labels={"rack": "r1", "tier": "gold"})
        offline = enroll(client, api, "offline", labels={"rack": "r2"})
        disabled = enroll(client, api, "disabled", labels={"rack": "r1"})
        gone = enroll(client, api, "gone", labels={"tier": "gold"})
        ok(beat(client, online))
        ok(beat(client, disabled))
        ok(patch_node(client, api, disabled.node_id, enabled=False))
        ok(decommission(client, api, gone.node_id))

        every = sorted(n.node_id for n in (online, offline, disabled, gone))
        assert list_nodes(client, api) == every
        assert list_nodes(client, api, {"liveness": "online"}) == [online.node_id]
        assert list_nodes(client, api, {"liveness": "offline"}) == [offline.node_id]
        assert list_nodes(client, api, {"liveness": "disabled"}) == [disabled.node_id]
        assert list_nodes(client, api, {"liveness": "decommissioned"}) == [gone.node_id]
        assert list_nodes(client, api, {"liveness": "stale"}) == []
        assert list_nodes(client, api, [("liveness", "online"), ("liveness", "disabled")]) == (
            sorted([online.node_id, disabled.node_id])
        )
        assert list_nodes(client, api, {"label": "rack=r1"}) == sorted(
            [online.node_id, disabled.node_id]
        )
        assert list_nodes(client, api, {"label": "rack"}) == sorted(
            [online.node_id, offline.node_id, disabled.node_id]
        )
        assert list_nodes(client, api, {"label": "tier"}) == sorted([online.node_id, gone.node_id])
        assert list_nodes(client, api, [("label", "rack=r1"), ("label", "tier=gold")]) == [
            online.node_id
        ]
        assert list_nodes(client, api, [("label", "rack"), ("liveness", "offline")]) == [
            offline.node_id
        ]
        assert list_nodes(client, api, {"label": "rack=r9"}) == []
        assert list_nodes(client, api, {"label": "nope"}) == []
        items = ok(client.get(NODES, params={"liveness": "online"}, headers=api.admin_headers))
        assert items["items"][0]["liveness"] == "online"
        refused(
            client.get(NODES, params={"liveness": "sleepy"}, headers=api.admin_headers),
            422,
            "validation_failed",
        )
        # Pagination over the stable enrollment order.
        page1 = ok(client.get(NODES, params={"limit": 2}, headers=api.admin_headers))["items"]
        page2 = ok(client.get(NODES, params={"limit": 2, "offset": 2}, headers=api.admin_headers))[
            "items"
        ]
        assert sorted(n["id"] for n in page1 + page2) == every


def test_node_detail(api: RunningApi) -> None:
    with api.client() as client:
        node = enroll(client, api, "detail-host", labels={"rack": "r3"}, display_name="Detail")
        fresh = get_node(client, api, node.node_id)
        assert fresh["id"] == node.node_id
        assert fresh["liveness"] == "offline" and fresh["last_heartbeat_at"] is None
        assert fresh["inventory"] is None and fresh["telemetry"] is None
        assert fresh["has_active_credential"] is True
        assert fresh["capabilities"] == ["hardware.inventory", "hardware.telemetry"]

        ok(beat(client, node))
        keep, drop = gpu(0), gpu(1)
        first_seen = now() - timedelta(seconds=5)
        ok(
            client.put(
                INVENTORY,
                json=inventory_body(
                    node.node_id,
                    1,
                    observed_at=first_seen,
                    gpus=[keep, drop],
                    hostname="detail-host",
                ),
                headers=node.headers,
            )
        )
        observed = now() - timedelta(seconds=1)
        ok(
            client.put(
                INVENTORY,
                json=inventory_body(
                    node.node_id, 2, observed_at=observed, gpus=[keep], hostname="detail-host"
                ),
                headers=node.headers,
            )
        )
        telemetry_at = now() - timedelta(seconds=2)
        ok(
            client.put(
                TELEMETRY,
                json=telemetry_body(
                    node.node_id, 5, observed_at=telemetry_at, gpu_uuids=[keep["uuid"]]
                ),
                headers=node.headers,
            )
        )

        view = get_node(client, api, node.node_id)
        assert view["hostname"] == "detail-host" and view["display_name"] == "Detail"
        assert view["labels"] == {"rack": "r3"}
        assert view["enabled"] is True and view["liveness"] == "online"
        assert view["agent_version"] == "1.0.0" and view["protocol_version"] == 1
        assert view["last_heartbeat_at"] is not None and view["enrolled_at"] is not None
        assert view["decommissioned_at"] is None

        assert view["inventory"]["complete"] is True
        assert view["inventory"]["host"]["hostname"] == "detail-host"
        inv = view["inventory_stream"]
        assert inv["cursor"] == 2 and inv["good_sequence"] == 2
        assert datetime.fromisoformat(inv["good_observed_at"]) == observed
        assert inv["good_received_at"] is not None
        assert datetime.fromisoformat(inv["good_received_at"]) >= datetime.fromisoformat(
            view["enrolled_at"]
        )
        assert inv["not_applied_reason"] is None

        assert view["telemetry"]["ram_used_bytes"] == 2**36
        assert [g["uuid"] for g in view["telemetry"]["gpus"]] == [keep["uuid"]]
        tel = view["telemetry_stream"]
        assert tel["cursor"] == 5 and tel["good_sequence"] == 5
        assert datetime.fromisoformat(tel["good_observed_at"]) == telemetry_at
        assert tel["good_received_at"] is not None

        gpus = {g["uuid"]: g for g in view["gpus"]}
        assert set(gpus) == {keep["uuid"], drop["uuid"]}
        assert gpus[keep["uuid"]]["missing"] is False
        assert gpus[keep["uuid"]]["missing_since"] is None
        assert gpus[drop["uuid"]]["missing"] is True
        assert gpus[drop["uuid"]]["missing_since"] is not None
        assert gpus[keep["uuid"]]["name"] == "NVIDIA H200"
        assert gpus[keep["uuid"]]["memory_total_bytes"] == 141 * 2**30


def test_node_patch_and_enablement(api: RunningApi) -> None:
    with api.client() as client:
        node = enroll(client, api, labels={"old": "1"})
        ok(beat(client, node))
        view = ok(
            patch_node(
                client,
                api,
                node.node_id,
                display_name="Renamed",
                labels={"rack": "r5", "pool": "train"},
            )
        )
        assert view["display_name"] == "Renamed"
        assert view["labels"] == {"rack": "r5", "pool": "train"}
        assert view["liveness"] == "online"
        # Labels are replaced, not merged; an empty patch changes nothing.
        unchanged = ok(patch_node(client, api, node.node_id))
        assert unchanged["labels"] == {"rack": "r5", "pool": "train"}
        assert unchanged["display_name"] == "Renamed"
        refused(patch_node(client, api, node.node_id, hostname="x"), 422, "validation_failed")
        refused(
            patch_node(client, api, node.node_id, labels={"k": "bad value"}),
            422,
            "validation_failed",
        )

        disabled = ok(patch_node(client, api, node.node_id, enabled=False))
        assert disabled["enabled"] is False and disabled["liveness"] == "disabled"
        for method, path, body in (
            ("POST", HEARTBEAT, heartbeat_body(node.node_id)),
            ("PUT", INVENTORY, inventory_body(node.node_id, 1)),
            ("PUT", TELEMETRY, telemetry_body(node.node_id, 1)),
        ):
            refused(
                client.request(method, path, json=body, headers=node.headers), 403, "node_disabled"
            )
        assert list_nodes(client, api, {"liveness": "disabled"}) == [node.node_id]
        # Disabling keeps the credential: re-enabling lets the same agent back in.
        assert get_node(client, api, node.node_id)["has_active_credential"] is True

        enabled = ok(patch_node(client, api, node.node_id, enabled=True))
        assert enabled["enabled"] is True and enabled["liveness"] == "online"
        ok(beat(client, node))
        ok(client.put(INVENTORY, json=inventory_body(node.node_id, 1), headers=node.headers))
        assert get_node(client, api, node.node_id)["liveness"] == "online"

        actions = [row["action"] for row in audit(client, api, target_id=node.node_id)]
        assert actions.count("node.updated") == 1
        assert actions.count("node.disabled") == 1 and actions.count("node.enabled") == 1


def test_unknown_and_invalid_node_ids(api: RunningApi) -> None:
    missing = str(uuid.uuid4())
    h = api.admin_headers
    with api.client() as client:
        calls = [
            ("GET", f"{NODES}/{{}}", None),
            ("PATCH", f"{NODES}/{{}}", {"display_name": "x"}),
            ("POST", f"{NODES}/{{}}/credential/revoke", None),
            ("POST", f"{NODES}/{{}}/credential/rotate", None),
            ("GET", f"{NODES}/{{}}/decommission/preview", None),
        ]
        for method, template, body in calls:
            refused(
                client.request(method, template.format(missing), json=body, headers=h),
                404,
                "not_found",
            )
            refused(
                client.request(method, template.format("not-a-uuid"), json=body, headers=h),
                422,
                "validation_failed",
            )
        response = client.post(
            f"{NODES}/{missing}/decommission",
            json={"confirm_node_id": missing, "reason": "x"},
            headers=h,
        )
        refused(response, 404, "not_found")
        refused(client.post(TOKENS, json={"node_id": missing}, headers=h), 404, "not_found")
        # None of that wrote anything.
        assert audit(client, api) == []


# --------------------------------------------------------------------------- credentials


def test_credential_revoke_and_rotate(api: RunningApi) -> None:
    with api.client() as client:
        node = enroll(client, api)
        ok(beat(client, node))
        revoked = ok(
            client.post(f"{NODES}/{node.node_id}/credential/revoke", headers=api.admin_headers)
        )
        assert revoked["revoked_credential_ids"] == [credential_id(node.credential)]
        refused(beat(client, node), 401, "credential_revoked")
        assert get_node(client, api, node.node_id)["has_active_credential"] is False
        # Revoking again: nothing left to revoke.
        again = ok(
            client.post(f"{NODES}/{node.node_id}/credential/revoke", headers=api.admin_headers)
        )
        assert again["revoked_credential_ids"] == []

        # Rotation after revocation issues a working credential and revokes nothing.
        rotated = ok(
            client.post(f"{NODES}/{node.node_id}/credential/rotate", headers=api.admin_headers)
        )
        assert rotated["revoked_credential_ids"] == []
        second = EnrolledNode(node.node_id, rotated["credential"])
        assert rotated["credential_id"] == credential_id(second.credential)
        ok(beat(client, second))

        # Rotation of an active credential revokes it and returns the replacement once.
        rotated = ok(
            client.post(f"{NODES}/{node.node_id}/credential/rotate", headers=api.admin_headers)
        )
        third = EnrolledNode(node.node_id, rotated["credential"])
        assert rotated["node_id"] == node.node_id
        assert rotated["revoked_credential_ids"] == [credential_id(second.credential)]
        refused(beat(client, second), 401, "credential_revoked")
        refused(beat(client, node), 401, "credential_revoked")
        ok(beat(client, third))
        ok(client.put(TELEMETRY, json=telemetry_body(node.node_id, 1), headers=third.headers))
        assert get_node(client, api, node.node_id)["has_active_credential"] is True
        # The replacement is never readable again.
        assert (
            third.credential.split(".")[2]
            not in client.get(f"{NODES}/{node.node_id}", headers=api.admin_headers).text
        )
        assert (
            third.credential.split(".")[2] not in client.get(AUDIT, headers=api.admin_headers).text
        )


# --------------------------------------------------------------------------- decommission


def test_decommission_lifecycle(api_factory: ApiFactory) -> None:
    api = api_factory()
    with api.client() as client:
        node = enroll(client, api)
        ok(beat(client, node))
        ok(
            client.put(
                INVENTORY, json=inventory_body(node.node_id, 1, gpus=[gpu(0)]), headers=node.headers
            )
        )
        recovery = create_token(client, api, node_id=node.node_id)
        recovery_id = token_id(recovery)
        unrelated = new_token(client, api)["token"]["id"]
        bystander = enroll(client, api, "bystander")

        preview_url = f"{NODES}/{node.node_id}/decommission/preview"
        audit_before = audit_count(client, api)
        preview = ok(client.get(preview_url, headers=api.admin_headers))
        assert preview["already_decommissioned"] is False
        assert preview["credentials_to_revoke"] == [credential_id(node.credential)]
        assert preview["enrollment_tokens_to_revoke"] == [recovery_id]
        assert preview["gpus"] == 1 and preview["liveness"] == "online"
        # The preview changed nothing.
        assert ok(client.get(preview_url, headers=api.admin_headers)) == preview
        assert audit_count(client, api) == audit_before
        ok(beat(client, node))
        active = ok(client.get(TOKENS, params={"state": "active"}, headers=api.admin_headers))
        assert sorted(t["id"] for t in active["items"]) == sorted([recovery_id, unrelated])

        refused(
            decommission(client, api, node.node_id, confirm=bystander.node_id),
            409,
            "identity_conflict",
        )
        refused(
            decommission(client, api, node.node_id, confirm=str(uuid.uuid4())),
            409,
            "identity_conflict",
        )
        ok(beat(client, node))  # still alive after the refused attempts

        result = ok(decommission(client, api, node.node_id))
        assert result["node_id"] == node.node_id and result["decommissioned_at"]
        assert result["revoked_credential_ids"] == [credential_id(node.credential)]
        assert result["revoked_enrollment_token_ids"] == [recovery_id]

        # The agent is refused everywhere, with the terminal code.
        for method, path, body in (
            ("POST", HEARTBEAT, heartbeat_body(node.node_id)),
            ("PUT", INVENTORY, inventory_body(node.node_id, 2)),
            ("PUT", TELEMETRY, telemetry_body(node.node_id, 1)),
        ):
            refused(
                client.request(method, path, json=body, headers=node.headers),
                401,
                "node_decommissioned",
            )
        # Operator management refuses the tombstone.
        base = f"{NODES}/{node.node_id}"
        h = api.admin_headers
        refused(client.post(f"{base}/credential/rotate", headers=h), 409, "node_terminal")
        refused(client.post(f"{base}/credential/revoke", headers=h), 409, "node_terminal")
        refused(patch_node(client, api, node.node_id, display_name="zombie"), 409, "node_terminal")
        refused(patch_node(client, api, node.node_id, enabled=True), 409, "node_terminal")
        refused(
            client.post(TOKENS, json={"node_id": node.node_id}, headers=h), 409, "node_terminal"
        )
        refused(decommission(client, api, node.node_id), 409, "node_terminal")
        # The recovery token issued before the decommission is dead.
        refused(
            client.post(ENROLL, json=enroll_body(recovery, node_id=node.node_id)),
            401,
            "enrollment_token_revoked",
        )
        refused(client.post(ENROLL, json=enroll_body(recovery)), 401, "enrollment_token_revoked")
        revoked = ok(client.get(TOKENS, params={"state": "revoked"}, headers=h))["items"]
        assert [t["id"] for t in revoked] == [recovery_id]
        # The unrelated token and the bystander are untouched.
        active = ok(client.get(TOKENS, params={"state": "active"}, headers=h))["items"]
        assert [t["id"] for t in active] == [unrelated]
        ok(beat(client, bystander))

        view = get_node(client, api, node.node_id)
        assert view["liveness"] == "decommissioned"
        assert view["decommissioned_at"] is not None
        assert view["has_active_credential"] is False
        after = ok(client.get(preview_url, headers=h))
        assert after["already_decommissioned"] is True
        assert after["credentials_to_revoke"] == [] and after["enrollment_tokens_to_revoke"] == []
        assert after["liveness"] == "decommissioned"
        decommissioned_rows = audit(client, api, action="node.decommissioned")
        assert len(decommissioned_rows) == 1
        assert decommissioned_rows[0]["details"]["revoked_enrollment_token_ids"] == [recovery_id]

    # Long after, on tiny thresholds, the tombstone still reads as decommissioned.
    quick = api_factory(stale_after_s=0.1, offline_after_s=0.2)
    time.sleep(0.3)
    with quick.client() as client:
        assert get_node(client, quick, node.node_id)["liveness"] == "decommissioned"
        assert get_node(client, quick, bystander.node_id)["liveness"] == "offline"
        assert list_nodes(client, quick, {"liveness": "decommissioned"}) == [node.node_id]
        assert list_nodes(client, quick, {"liveness": "offline"}) == [bystander.node_id]


# --------------------------------------------------------------------------- recovery


def test_recovery_enrollment(api: RunningApi) -> None:
    with api.client() as client:
        node = enroll(client, api, "before-reinstall", labels={"rack": "r1"})
        ok(beat(client, node))
        other = enroll(client, api, "other")

        # An ordinary token cannot adopt an existing identity.
        ordinary = create_token(client, api)
        refused(
            client.post(ENROLL, json=enroll_body(ordinary, node_id=node.node_id)),
            409,
            "identity_conflict",
        )
        refused(
            client.post(ENROLL, json=enroll_body(ordinary, node_id=str(uuid.uuid4()))),
            409,
            "identity_conflict",
        )

        recovery = create_token(client, api, node_id=node.node_id)
        created = [
            t
            for t in ok(client.get(TOKENS, headers=api.admin_headers))["items"]
            if t["id"] == token_id(recovery)
        ]
        assert created[0]["node_id"] == node.node_id
        # A recovery token for X cannot bind another identity.
        refused(
            client.post(ENROLL, json=enroll_body(recovery, node_id=other.node_id)),
            409,
            "identity_conflict",
        )
        # Neither refusal consumed a token or touched the nodes.
        active = ok(client.get(TOKENS, params={"state": "active"}, headers=api.admin_headers))
        assert sorted(t["id"] for t in active["items"]) == sorted(
            [token_id(ordinary), token_id(recovery)]
        )
        ok(beat(client, node))
        ok(beat(client, other))

        data = ok(
            client.post(
                ENROLL, json=enroll_body(recovery, "after-reinstall", node_id=node.node_id)
            ),
            201,
        )
        assert data["node_id"] == node.node_id
        rebound = EnrolledNode(node.node_id, data["credential"])
        refused(beat(client, node), 401, "credential_revoked")
        ok(beat(client, rebound))
        ok(beat(client, other))
        view = get_node(client, api, node.node_id)
        assert view["hostname"] == "after-reinstall"
        assert view["labels"] == {"rack": "r1"}  # identity kept, not recreated
        assert len(list_nodes(client, api)) == 2
        enrolled = audit(client, api, action="node.enrolled", target_id=node.node_id)
        assert [row["details"]["rebound"] for row in enrolled] == [True, False]

        # A recovery token also works without repeating node_id in the body.
        second = create_token(client, api, node_id=node.node_id)
        data = ok(client.post(ENROLL, json=enroll_body(second, "again")), 201)
        assert data["node_id"] == node.node_id
        refused(beat(client, rebound), 401, "credential_revoked")
        # And the ordinary token still makes a brand-new node.
        fresh = enroll_with(client, ordinary, "brand-new")
        assert fresh.node_id not in {node.node_id, other.node_id}


# --------------------------------------------------------------------------- liveness


def test_liveness_on_read(api_factory: ApiFactory) -> None:
    api = api_factory(stale_after_s=1, offline_after_s=2)
    with api.client() as client:
        node = enroll(client, api, "beating")
        silent = enroll(client, api, "silent")
        assert get_node(client, api, silent.node_id)["liveness"] == "offline"
        ok(beat(client, node))
        start = time.monotonic()
        assert get_node(client, api, node.node_id)["liveness"] == "online"

        time.sleep(max(0.0, start + 1.2 - time.monotonic()))
        assert get_node(client, api, node.node_id)["liveness"] == "stale"
        assert list_nodes(client, api, {"liveness": "stale"}) == [node.node_id]
        # Telemetry is not a heartbeat: it does not revive liveness.
        ok(client.put(TELEMETRY, json=telemetry_body(node.node_id, 1), headers=node.headers))
        assert get_node(client, api, node.node_id)["liveness"] == "stale"

        time.sleep(max(0.0, start + 2.2 - time.monotonic()))
        assert get_node(client, api, node.node_id)["liveness"] == "offline"
        assert list_nodes(client, api, {"liveness": "offline"}) == sorted(
            [node.node_id, silent.node_id]
        )

        ok(beat(client, node))
        assert get_node(client, api, node.node_id)["liveness"] == "online"
        assert get_node(client, api, silent.node_id)["liveness"] == "offline"


def test_heartbeat_observed_at_does_not_drive_liveness(api_factory: ApiFactory) -> None:
    api = api_factory(stale_after_s=1, offline_after_s=2)
    with api.client() as client:
        node = enroll(client, api)
        # An agent clock far in the past or future changes nothing: server time decides.
        ok(beat(client, node, observed_at=(now() - timedelta(days=2)).isoformat()))
        assert get_node(client, api, node.node_id)["liveness"] == "online"
        ok(beat(client, node, observed_at=(now() + timedelta(days=2)).isoformat()))
        view = get_node(client, api, node.node_id)
        assert view["liveness"] == "online"
        received = datetime.fromisoformat(view["last_heartbeat_at"])
        assert abs(received - now()) < timedelta(seconds=30)


# --------------------------------------------------------------------------- fail closed


def admin_operations(client: httpx.Client) -> list[tuple[str, str]]:
    spec = ok(client.get("/openapi.json"))
    operations = [
        (method.upper(), path)
        for path, methods in spec["paths"].items()
        if path.startswith("/api/v1/admin")
        for method in methods
        if method in {"get", "post", "put", "patch", "delete"}
    ]
    # Guard against an empty or truncated enumeration.
    assert len(operations) >= 11, operations
    assert ("POST", "/api/v1/admin/hardware/nodes/{node_id}/decommission") in operations
    assert ("GET", "/api/v1/admin/audit") in operations
    return operations


def call_admin(
    client: httpx.Client, method: str, path: str, headers: dict[str, str]
) -> httpx.Response:
    concrete = path
    for name in ("node_id", "token_id"):
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


# --------------------------------------------------------------------------- audit


def test_audit_log_queries(api: RunningApi) -> None:
    with api.client() as client:
        token = new_token(client, api, labels={"rack": "r1"})
        tid = token["token"]["id"]
        node = enroll_with(client, token["secret"])
        probe = "audit-probe-7c1e"
        response = client.patch(
            f"{NODES}/{node.node_id}",
            json={"display_name": "audited"},
            headers={**api.admin_headers, "X-Correlation-ID": probe},
        )
        ok(response)
        rotated = ok(
            client.post(f"{NODES}/{node.node_id}/credential/rotate", headers=api.admin_headers)
        )
        ok(client.post(f"{NODES}/{node.node_id}/credential/revoke", headers=api.admin_headers))
        ok(decommission(client, api, node.node_id))

        rows = audit(client, api)
        actions = [row["action"] for row in rows]
        assert actions == [
            "node.decommissioned",
            "node.credential.revoked",
            "node.credential.rotated",
            "node.updated",
            "node.enrolled",
            "token.created",
        ]
        ids = [row["id"] for row in rows]
        assert ids == sorted(ids, reverse=True)  # newest first

        # By action.
        for action in set(actions):
            matched = audit(client, api, action=action)
            assert [row["action"] for row in matched] == [action]
        assert audit(client, api, action="node.nonexistent") == []
        # By target.
        node_rows = audit(client, api, target_id=node.node_id)
        assert [row["action"] for row in node_rows] == actions[:5]
        assert all(row["target_type"] == "node" for row in node_rows)
        token_rows = audit(client, api, target_id=tid)
        assert [row["action"] for row in token_rows] == ["token.created"]
        assert token_rows[0]["target_type"] == "enrollment_token"
        assert [r["action"] for r in audit(client, api, target_type="enrollment_token")] == [
            "token.created"
        ]
        # By actor: the node enrolls itself; the operator does the rest.
        by_node = audit(client, api, actor=f"node:{node.node_id}")
        assert [row["action"] for row in by_node] == ["node.enrolled"]
        by_operator = audit(client, api, actor="operator")
        assert len(by_operator) == 5 and "node.enrolled" not in [r["action"] for r in by_operator]
        # By correlation id: the patch sent with a known id.
        probed = audit(client, api, correlation_id=probe)
        assert len(probed) == 1
        assert probed[0]["action"] == "node.updated"
        assert probed[0]["details"]["changes"]["display_name"] == [None, "audited"]
        assert all(row["correlation_id"] for row in rows)
        # Details name what changed, never a secret.
        rotate_row = next(r for r in rows if r["action"] == "node.credential.rotated")
        assert rotate_row["details"]["credential_id"] == rotated["credential_id"]
        assert rotate_row["details"]["revoked"] == [credential_id(node.credential)]
        assert rotated["credential"].split(".")[2] not in str(rows)

        # since / until partition the log at a row's own timestamp.
        pivot = rows[2]["at"]
        pivot_at = datetime.fromisoformat(pivot)
        since = audit(client, api, since=pivot)
        until = audit(client, api, until=pivot)
        assert {r["id"] for r in since} | {r["id"] for r in until} == set(ids)
        assert not {r["id"] for r in since} & {r["id"] for r in until}
        assert rows[2]["id"] in {r["id"] for r in since}
        assert rows[-1]["id"] in {r["id"] for r in until}
        assert all(datetime.fromisoformat(r["at"]) >= pivot_at for r in since)
        assert all(datetime.fromisoformat(r["at"]) < pivot_at for r in until)
        future = (now() + timedelta(hours=1)).isoformat()
        past = (now() - timedelta(hours=1)).isoformat()
        assert audit(client, api, since=future) == []
        assert len(audit(client, api, since=past, until=future)) == len(rows)
        refused(
            client.get(AUDIT, params={"since": "2025-01-01T00:00:00"}, headers=api.admin_headers),
            422,
            "validation_failed",
        )

        # Keyset pagination.
        seen: list[int] = []
        before: int | None = None
        pages = 0
        while True:
            params: dict[str, Any] = {"limit": 2}
            if before is not None:
                params["before_id"] = before
            page = ok(client.get(AUDIT, params=params, headers=api.admin_headers))
            pages += 1
            assert len(page["items"]) <= 2
            seen.extend(row["id"] for row in page["items"])
            before = page["next_before_id"]
            if before is None:
                break
            assert before == page["items"][-1]["id"]
        assert seen == ids
        assert pages == 3
        last = ok(client.get(AUDIT, params={"limit": 6}, headers=api.admin_headers))
        assert last["next_before_id"] is None and len(last["items"]) == 6
        filtered_page = ok(
            client.get(
                AUDIT, params={"limit": 2, "target_id": node.node_id}, headers=api.admin_headers
            )
        )
        assert [r["action"] for r in filtered_page["items"]] == actions[:2]
        rest = audit(client, api, target_id=node.node_id, before_id=filtered_page["next_before_id"])
        assert [r["action"] for r in rest] == actions[2:5]


def test_plain_heartbeats_write_no_audit_or_events(api: RunningApi, database_url: str) -> None:
    with api.client() as client:
        node = enroll(client, api)
        # The first heartbeat is a change: the node comes online (recorded once).
        ok(beat(client, node))
        online = audit(client, api, action="node.liveness.changed")
        assert [(r["details"]["previous"], r["details"]["current"]) for r in online] == [
            ("offline", "online")
        ]
        assert online[0]["details"]["decided_by"] == "heartbeat"
        audit_before = audit_count(client, api)
        events_before = outbox_count(database_url)
        for _ in range(20):
            ok(beat(client, node))
        assert audit_count(client, api) == audit_before
        assert outbox_count(database_url) == events_before

        # A changed agent version is recorded once, as an audit row and an event.
        ok(beat(client, node, agent_version="1.1.0"))
        changed = audit(client, api, action="node.agent.changed")
        assert len(changed) == 1
        assert changed[0]["target_id"] == node.node_id
        assert changed[0]["actor"] == f"node:{node.node_id}"
        assert changed[0]["details"]["agent_version"] == "1.1.0"
        assert changed[0]["details"]["previous_agent_version"] == "1.0.0"
        assert audit_count(client, api) == audit_before + 1
        assert outbox_count(database_url) == events_before + 1
        assert get_node(client, api, node.node_id)["agent_version"] == "1.1.0"

        # Repeating the new version is a plain heartbeat again.
        for _ in range(5):
            ok(beat(client, node, agent_version="1.1.0"))
        assert audit_count(client, api) == audit_before + 1
        assert outbox_count(database_url) == events_before + 1


def test_audit_rows_are_atomic_with_their_change(api: RunningApi, database_url: str) -> None:
    with api.client() as client:
        h = api.admin_headers
        missing = str(uuid.uuid4())
        refused(client.post(f"{NODES}/{missing}/credential/rotate", headers=h), 404, "not_found")
        assert audit(client, api) == []
        assert audit(client, api, target_id=missing) == []
        assert outbox_count(database_url) == 0

        node = enroll(client, api)
        rows = audit_count(client, api)
        events = outbox_count(database_url)
        # A refused change leaves neither audit row nor event.
        ok(decommission(client, api, node.node_id))
        rows, events = rows + 1, events + 1
        assert audit_count(client, api) == rows
        assert outbox_count(database_url) == events
        for response in (
            client.post(f"{NODES}/{node.node_id}/credential/rotate", headers=h),
            client.post(f"{NODES}/{node.node_id}/credential/revoke", headers=h),
            patch_node(client, api, node.node_id, enabled=False),
            decommission(client, api, node.node_id),
        ):
            refused(response, 409, "node_terminal")
        assert audit_count(client, api) == rows
        assert outbox_count(database_url) == events
        active = db_scalar(
            database_url,
            "SELECT count(*) FROM node_credentials WHERE node_id = :n AND revoked_at IS NULL",
            n=uuid.UUID(node.node_id),
        )
        assert active == 0

        # An enrollment refused after the token was claimed rolls the claim back too.
        token = create_token(client, api)
        rows, events = rows + 1, events + 1
        refused(
            client.post(ENROLL, json=enroll_body(token, node_id=node.node_id)),
            409,
            "identity_conflict",
        )
        assert audit_count(client, api) == rows
        assert outbox_count(database_url) == events
        listed = ok(client.get(TOKENS, params={"state": "active"}, headers=h))["items"]
        assert [t["id"] for t in listed] == [token_id(token)]

        # A successful rotation writes its audit row and its event in one go, with one
        # correlation id.
        other = enroll_with(client, token, "other")
        rows, events = rows + 1, events + 1
        response = client.post(
            f"{NODES}/{other.node_id}/credential/rotate",
            headers={**h, "X-Correlation-ID": "rotate-atomic-1"},
        )
        ok(response)
        assert audit_count(client, api) == rows + 1
        assert outbox_count(database_url) == events + 1
        assert len(audit(client, api, correlation_id="rotate-atomic-1")) == 1
        tagged = db_scalar(
            database_url,
            "SELECT count(*) FROM outbox WHERE envelope->>'correlationid' = :c",
            c="rotate-atomic-1",
        )
        assert tagged == 1
