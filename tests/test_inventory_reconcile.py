"""GPU reconciliation by (node_id, GPU UUID), host facts and telemetry, example by example.

Every meaningful change shows in the node detail, in the audit log (admin API) and as a
CloudEvent row in the transactional outbox (read straight from PostgreSQL).
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import httpx

from schemas.protocol import AUDIT
from tests.api_server import RunningApi
from tests.flows import (
    INVENTORY,
    NODES,
    TELEMETRY,
    EnrolledNode,
    enroll,
    gpu,
    inventory_body,
    now,
    telemetry_body,
)
from tests.services import db_fetch

GPU_A = "GPU-aaaaaaaa-0000-0000-0000-000000000001"
GPU_B = "GPU-bbbbbbbb-0000-0000-0000-000000000002"


async def outbox_events(
    database_url: str, node_id: str, *, accepted: bool = False
) -> list[tuple[str, dict[str, Any]]]:
    """(subject suffix after the node id, envelope) of this node's outbox rows, in order;
    the node.inventory.accepted work items only when asked for."""
    prefix = f"modelforge.v1.node.{node_id}."
    rows = await db_fetch(
        database_url,
        "SELECT subject, envelope::text AS envelope FROM outbox "
        "WHERE subject LIKE $1 ORDER BY position",
        prefix + "%",
    )
    events = [(row["subject"].removeprefix(prefix), json.loads(row["envelope"])) for row in rows]
    return [e for e in events if accepted or e[0] != "inventory.accepted"]


def detail(client: httpx.Client, api: RunningApi, node: EnrolledNode) -> dict[str, Any]:
    api.settle()
    response = client.get(f"{NODES}/{node.node_id}", headers=api.admin_headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def gpus_by_uuid(client: httpx.Client, api: RunningApi, node: EnrolledNode) -> dict[str, Any]:
    return {g["uuid"]: g for g in detail(client, api, node)["gpus"]}


def node_audit(
    client: httpx.Client, api: RunningApi, node: EnrolledNode, **params: str
) -> list[dict[str, Any]]:
    api.settle()
    response = client.get(
        AUDIT,
        headers=api.admin_headers,
        params={"actor": f"node:{node.node_id}", "limit": "1000", **params},
    )
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return list(reversed(items))  # oldest first


def put_inventory(
    client: httpx.Client, node: EnrolledNode, sequence: int, **kwargs: Any
) -> dict[str, Any]:
    response = client.put(
        INVENTORY, json=inventory_body(node.node_id, sequence, **kwargs), headers=node.headers
    )
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def at(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


async def test_gpu_added_missing_kept_returned_and_moved(
    api: RunningApi, database_url: str
) -> None:
    with api.client() as client:
        node = enroll(client, api)

        # 1. Two GPUs appear.
        first = put_inventory(client, node, 1, gpus=[gpu(0, GPU_A), gpu(1, GPU_B)])
        assert first["applied"] is True
        gpus = gpus_by_uuid(client, api, node)
        assert set(gpus) == {GPU_A, GPU_B}
        assert all(not g["missing"] and g["missing_since"] is None for g in gpus.values())
        assert at(gpus[GPU_A]["first_seen_at"]) == at(first["received_at"])
        added = node_audit(client, api, node, action="node.gpu.added")
        assert sorted(row["target_id"] for row in added) == sorted(
            [f"{node.node_id}/{GPU_A}", f"{node.node_id}/{GPU_B}"]
        )
        assert {row["details"]["gpu_uuid"] for row in added} == {GPU_A, GPU_B}

        # 2. A complete inventory without B: B is missing since that report.
        second = put_inventory(client, node, 2, gpus=[gpu(0, GPU_A)])
        assert second["applied"] is True
        gpus = gpus_by_uuid(client, api, node)
        assert gpus[GPU_B]["missing"] is True
        assert at(gpus[GPU_B]["missing_since"]) == at(second["received_at"])
        assert gpus[GPU_A]["missing"] is False
        assert at(gpus[GPU_A]["last_seen_at"]) == at(second["received_at"])
        missing = node_audit(client, api, node, action="node.gpu.missing")
        assert [row["target_id"] for row in missing] == [f"{node.node_id}/{GPU_B}"]

        # 3. NVML failed: an incomplete, empty inventory keeps every GPU as it was.
        before = gpus_by_uuid(client, api, node)
        audit_before = node_audit(client, api, node)
        third = put_inventory(client, node, 3, complete=False, gpus=[])
        assert third["applied"] is True
        assert gpus_by_uuid(client, api, node) == before
        assert node_audit(client, api, node) == audit_before
        view = detail(client, api, node)
        assert view["inventory"]["complete"] is False
        assert view["inventory_stream"]["good_sequence"] == 3

        # 4. B comes back.
        fourth = put_inventory(client, node, 4, gpus=[gpu(0, GPU_A), gpu(1, GPU_B)])
        assert fourth["applied"] is True
        gpus = gpus_by_uuid(client, api, node)
        assert gpus[GPU_B]["missing"] is False
        assert gpus[GPU_B]["missing_since"] is None
        assert at(gpus[GPU_B]["first_seen_at"]) == at(first["received_at"])
        returned = node_audit(client, api, node, action="node.gpu.returned")
        assert [row["target_id"] for row in returned] == [f"{node.node_id}/{GPU_B}"]

        # 5. A moves to another slot: same UUID, new index and PCI bus id. Still one GPU.
        moved = gpu(0, GPU_A) | {"index": 3, "pci_bus_id": "00000000:c1:00.0"}
        fifth = put_inventory(client, node, 5, gpus=[moved, gpu(1, GPU_B)])
        assert fifth["applied"] is True
        gpus = gpus_by_uuid(client, api, node)
        assert set(gpus) == {GPU_A, GPU_B}
        assert (gpus[GPU_A]["index"], gpus[GPU_A]["pci_bus_id"]) == (3, "00000000:c1:00.0")
        assert at(gpus[GPU_A]["first_seen_at"]) == at(first["received_at"])
        changed = node_audit(client, api, node, action="node.gpu.changed")
        assert [row["target_id"] for row in changed] == [f"{node.node_id}/{GPU_A}"]
        assert changed[0]["details"]["changes"] == {
            "index": [0, 3],
            "pci_bus_id": ["00000000:01:00.0", "00000000:c1:00.0"],
        }

        # The same report again changes nothing and records nothing.
        audit_before = node_audit(client, api, node)
        assert put_inventory(client, node, 6, gpus=[moved, gpu(1, GPU_B)])["applied"] is True
        assert node_audit(client, api, node) == audit_before

    # The outbox holds one CloudEvent per change, in order, on the node's subjects; each
    # accepted report has its own event, which the workers reconciled from.
    everything = await outbox_events(database_url, node.node_id, accepted=True)
    accepted = [envelope for suffix, envelope in everything if suffix == "inventory.accepted"]
    assert [envelope["data"]["sequence"] for envelope in accepted] == [1, 2, 3, 4, 5, 6]
    events = [(suffix, e) for suffix, e in everything if suffix != "inventory.accepted"]
    assert [suffix for suffix, _ in events] == [
        "enrolled",
        "gpu.added",
        "gpu.added",
        "gpu.missing",
        "gpu.returned",
        "gpu.changed",
    ]
    gpu_events = [(suffix, envelope) for suffix, envelope in events if suffix.startswith("gpu.")]
    assert [envelope["data"]["gpu_uuid"] for _, envelope in gpu_events] == [
        GPU_A,
        GPU_B,
        GPU_B,
        GPU_B,
        GPU_A,
    ]
    # A GPU event carries the correlation id of the report it was reconciled from.
    by_correlation = {envelope["correlationid"] for envelope in accepted}
    assert len(by_correlation) == len(accepted)
    for suffix, envelope in gpu_events:
        assert envelope["correlationid"] in by_correlation
        assert envelope["actor"] == f"node:{node.node_id}"
        assert envelope["type"] == f"io.modelforge.node.{suffix}.v1"
        assert envelope["subject"] == f"modelforge.v1.node.{node.node_id}.{suffix}"
        assert envelope["nodeid"] == node.node_id
        assert envelope["data"]["node_id"] == node.node_id
    assert gpu_events[-1][1]["data"]["changes"] == {
        "index": [0, 3],
        "pci_bus_id": ["00000000:01:00.0", "00000000:c1:00.0"],
    }


async def test_not_applied_inventory_changes_no_gpu(api: RunningApi, database_url: str) -> None:
    with api.client() as client:
        node = enroll(client, api)
        base = now()
        put_inventory(client, node, 1, observed_at=base, gpus=[gpu(0, GPU_A), gpu(1, GPU_B)])
        before = detail(client, api, node)

        # Older than last-good, and far in the future: the cursor moves, nothing else does.
        stale = put_inventory(
            client, node, 2, observed_at=base - timedelta(hours=1), gpus=[gpu(0, GPU_A)]
        )
        assert (stale["applied"], stale["reason"]) == (False, "observed_before_last_good")
        future = put_inventory(
            client,
            node,
            3,
            observed_at=base + timedelta(days=1),
            gpus=[gpu(5, GPU_A)],
            hostname="from-the-future",
        )
        assert (future["applied"], future["reason"]) == (False, "observed_in_future")
        after = detail(client, api, node)
        assert after["gpus"] == before["gpus"]
        assert after["hostname"] == before["hostname"]
        assert after["inventory"] == before["inventory"]
        assert after["inventory_stream"]["cursor"] == 3
        assert after["inventory_stream"]["good_sequence"] == 1
        assert after["inventory_stream"]["not_applied_reason"] == "observed_in_future"

    events = [suffix for suffix, _ in await outbox_events(database_url, node.node_id)]
    # One not-applied event per reason episode, no GPU or host change events.
    assert Counter(events) == Counter({"enrolled": 1, "gpu.added": 2, "stream.not_applied": 2})


async def test_hostname_change_in_host_facts_updates_node(
    api: RunningApi, database_url: str
) -> None:
    with api.client() as client:
        node = enroll(client, api, hostname="old-name")
        put_inventory(client, node, 1, hostname="old-name")
        assert node_audit(client, api, node, action="node.updated") == []

        put_inventory(client, node, 2, hostname="new-name")
        view = detail(client, api, node)
        assert view["hostname"] == "new-name"
        assert view["inventory"]["host"]["hostname"] == "new-name"
        updated = node_audit(client, api, node, action="node.updated")
        assert [row["details"] for row in updated] == [
            {"changes": {"hostname": ["old-name", "new-name"]}}
        ]
        listed = client.get(NODES, headers=api.admin_headers).json()["items"]
        assert [n["hostname"] for n in listed if n["id"] == node.node_id] == ["new-name"]

    events = await outbox_events(database_url, node.node_id)
    assert [suffix for suffix, _ in events] == ["enrolled", "updated"]
    assert events[1][1]["data"]["changes"] == {"hostname": ["old-name", "new-name"]}


async def test_applied_telemetry_shows_in_node_detail_without_audit_noise(
    api: RunningApi, database_url: str
) -> None:
    with api.client() as client:
        node = enroll(client, api)
        observed = now() - timedelta(seconds=2)
        body = telemetry_body(node.node_id, 1, observed_at=observed, gpu_uuids=[GPU_A])
        response = client.put(TELEMETRY, json=body, headers=node.headers)
        assert response.status_code == 200, response.text
        result = response.json()
        assert (result["applied"], result["reason"]) == (True, None)

        view = detail(client, api, node)
        stream = view["telemetry_stream"]
        assert stream["cursor"] == 1
        assert stream["good_sequence"] == 1
        assert at(stream["good_observed_at"]) == observed
        received = at(stream["good_received_at"])
        assert received == at(result["received_at"])
        assert received is not None
        assert received >= observed
        assert stream["not_applied_reason"] is None
        telemetry = view["telemetry"]
        assert telemetry["ram_total_bytes"] == body["ram_total_bytes"]
        assert telemetry["ram_used_bytes"] == body["ram_used_bytes"]
        assert telemetry["storage"] == body["storage"]
        assert [g["uuid"] for g in telemetry["gpus"]] == [GPU_A]
        assert telemetry["gpus"][0]["utilization_percent"] == 50.0
        # Inventory has not been reported: its stream exists but is empty.
        assert view["inventory"] is None
        assert view["inventory_stream"]["cursor"] == 0

        # High-rate telemetry does not flood the audit log or the outbox.
        for sequence in range(2, 12):
            more = telemetry_body(node.node_id, sequence, gpu_uuids=[GPU_A])
            assert client.put(TELEMETRY, json=more, headers=node.headers).status_code == 200
        assert [row["action"] for row in node_audit(client, api, node)] == ["node.enrolled"]
        assert detail(client, api, node)["telemetry_stream"]["good_sequence"] == 11

    events = [suffix for suffix, _ in await outbox_events(database_url, node.node_id)]
    assert events == ["enrolled"]


def test_duplicate_gpu_uuids_in_one_report_are_rejected(api: RunningApi) -> None:
    with api.client() as client:
        node = enroll(client, api)
        body = inventory_body(node.node_id, 1, gpus=[gpu(0, GPU_A), gpu(1, GPU_A)])
        response = client.put(INVENTORY, json=body, headers=node.headers)
        assert response.status_code == 422, response.text
        error = response.json()
        assert error["code"] == "validation_failed"
        assert any("each GPU UUID may appear once" in d["message"] for d in error["details"])
        assert error["correlation_id"]

        # Nothing was recorded: the same sequence is still free and no GPU exists.
        view = detail(client, api, node)
        assert view["gpus"] == []
        assert view["inventory_stream"]["cursor"] == 0
        accepted = put_inventory(client, node, 1, gpus=[gpu(0, GPU_A)])
        assert accepted["applied"] is True
        assert list(gpus_by_uuid(client, api, node)) == [GPU_A]


def test_gpus_reconcile_per_node_by_uuid(api: RunningApi) -> None:
    """The same GPU UUID reported by two nodes is two GPUs: identity is (node_id, UUID)."""
    with api.client() as client:
        one = enroll(client, api, hostname="node-one")
        two = enroll(client, api, hostname="node-two")
        put_inventory(client, one, 1, gpus=[gpu(0, GPU_A)], hostname="node-one")
        put_inventory(client, two, 1, gpus=[gpu(2, GPU_A)], hostname="node-two")
        put_inventory(client, two, 2, gpus=[], hostname="node-two")

        first = gpus_by_uuid(client, api, one)[GPU_A]
        second = gpus_by_uuid(client, api, two)[GPU_A]
        assert (first["index"], first["missing"]) == (0, False)
        assert (second["index"], second["missing"]) == (2, True)
        assert uuid.UUID(one.node_id) != uuid.UUID(two.node_id)
