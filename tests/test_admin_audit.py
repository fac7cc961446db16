"""The audit log: queries, no rows for plain heartbeats, atomic with its change."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from schemas.protocol import AUDIT
from tests.admin_helpers import (
    audit,
    audit_count,
    beat,
    credential_id,
    db_scalar,
    decommission,
    enroll_with,
    get_node,
    new_token,
    ok,
    outbox_count,
    patch_node,
    refused,
    token_id,
)
from tests.api_server import RunningApi
from tests.artifact_flows import created, node_with_roots
from tests.flows import (
    ENROLL,
    NODES,
    TOKENS,
    create_token,
    enroll,
    enroll_body,
    now,
)
from tests.runtime_flows import create_probe, report_runtime

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
        assert rotate_row["details"]["revoked_credential_ids"] == [credential_id(node.credential)]
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


def test_audit_filters_by_kind_node_and_hides_health_checks(api: RunningApi) -> None:
    """kind (the action's family), node_id (its own rows and those whose details name
    it), and the periodic health-check jobs' rows left out unless health_checks=true."""
    with api.client() as client:
        node = node_with_roots(client, api, hostname="audit-node")
        other = enroll(client, api, hostname="audit-other")
        assert report_runtime(client, node).status_code == 200
        health = {"kind": "runtime.health.v1", "node_id": node.node_id, "device_id": "cpu"}
        health_job = ok(create_probe(client, api, health), 201)["id"]
        evict_job = created(client, api, node)  # an artifact job: not a health check

        every = audit(client, api, health_checks="true")
        assert health_job in {r["target_id"] for r in every}
        shown = audit(client, api)
        # Left out by default: the health check's row, and only it.
        assert {r["id"] for r in every} - {r["id"] for r in shown} == {
            r["id"] for r in every if r["target_id"] == health_job
        }
        assert evict_job in {r["target_id"] for r in shown}

        jobs = audit(client, api, kind="job", health_checks="true")
        assert {r["target_id"] for r in jobs} == {health_job, evict_job}
        assert all(r["action"].startswith("job.") for r in jobs)
        assert [r["target_id"] for r in audit(client, api, kind="job")] == [evict_job]
        assert {r["action"].split(".")[0] for r in audit(client, api, kind="node")} == {"node"}
        assert audit(client, api, kind="nothing") == []

        # The node's rows: its enrollment and the jobs on it; never the other node's.
        mine = audit(client, api, node_id=node.node_id, health_checks="true")
        assert {r["target_id"] for r in mine} == {node.node_id, health_job, evict_job}
        theirs = audit(client, api, node_id=other.node_id)
        assert [r["action"] for r in theirs] == ["node.enrolled"]
        # Filters combine, and page by before_id as the unfiltered log does.
        page = ok(client.get(AUDIT, params={"node_id": node.node_id, "kind": "node", "limit": 1},
                             headers=api.admin_headers))  # fmt: skip
        assert [r["action"] for r in page["items"]] == ["node.enrolled"]
        refused(client.get(AUDIT, params={"node_id": "x"}, headers=api.admin_headers),
                422, "validation_failed")  # fmt: skip
