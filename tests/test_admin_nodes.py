"""Nodes over real HTTP: list filters, detail, metadata and enablement, liveness on read."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from tests.admin_helpers import (
    audit,
    beat,
    decommission,
    get_node,
    list_nodes,
    ok,
    patch_node,
    refused,
)
from tests.agent.harness import wait_until
from tests.api_server import ApiFactory, RunningApi
from tests.flows import (
    HEARTBEAT,
    INVENTORY,
    NODES,
    TELEMETRY,
    TOKENS,
    enroll,
    gpu,
    heartbeat_body,
    inventory_body,
    now,
    telemetry_body,
)

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

        # A worker applies accepted inventory: wait for it, not for luck.
        api.settle()
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
            json={"confirm_node_id": missing, "plan_hash": "0" * 64, "reason": "x"},
            headers=h,
        )
        refused(response, 404, "not_found")
        refused(client.post(TOKENS, json={"node_id": missing}, headers=h), 404, "not_found")
        # None of that wrote anything.
        assert audit(client, api) == []


# --------------------------------------------------------------------------- liveness


def test_liveness_on_read(api_factory: ApiFactory) -> None:
    api = api_factory(stale_after_s=1, offline_after_s=2)
    with api.client() as client:
        node = enroll(client, api, "beating")
        silent = enroll(client, api, "silent")
        assert get_node(client, api, silent.node_id)["liveness"] == "offline"
        ok(beat(client, node))
        assert get_node(client, api, node.node_id)["liveness"] == "online"

        def liveness_is(state: str) -> bool:
            return bool(get_node(client, api, node.node_id)["liveness"] == state)

        wait_until(lambda: liveness_is("stale"), 10, "the silent node stale")
        assert list_nodes(client, api, {"liveness": "stale"}) == [node.node_id]
        # Telemetry is not a heartbeat: it does not revive liveness.
        ok(client.put(TELEMETRY, json=telemetry_body(node.node_id, 1), headers=node.headers))
        assert get_node(client, api, node.node_id)["liveness"] == "stale"

        wait_until(lambda: liveness_is("offline"), 10, "the silent node offline")
        assert list_nodes(client, api, {"liveness": "offline"}) == sorted(
            [node.node_id, silent.node_id]
        )

        # Recorded online still (no sweep runs here), the node is in the node cache and
        # this heartbeat is routine: it lands with the next group commit, not at once.
        ok(beat(client, node))
        wait_until(lambda: liveness_is("online"), 10, "the node online again")
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
