"""Credential revocation and rotation, permanent decommission, recovery enrollment."""

from __future__ import annotations

import re
import uuid
from typing import Any

import httpx
import pytest

from schemas.admin import DecommissionDeployment, DecommissionJob
from schemas.deployments import DeploymentState
from schemas.jobs import JobKind, JobState
from schemas.protocol import AUDIT
from store.decommission import Plan, plan_hash
from tests.admin_helpers import (
    audit,
    audit_count,
    beat,
    credential_id,
    decommission,
    decommission_body,
    enroll_with,
    get_node,
    list_nodes,
    new_token,
    ok,
    outbox_count,
    patch_node,
    refused,
    token_id,
)
from tests.agent.harness import wait_until
from tests.api_server import ApiFactory, RunningApi
from tests.artifact_flows import claimed, created, get_job, node_with_roots
from tests.deployment_flows import (
    claim_deployment_job,
    complete_load,
    create_deployment,
    deployment,
    deployment_body,
)
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
    released_together,
    telemetry_body,
)
from tests.runtime_flows import create_profile, environment_id, ready_node

# Concurrent executes of one previewed plan.
RACERS = 8

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
        # The replacement is never readable again, nor in the audit rows the workers
        # write for the rotations (waited for: a missing row would prove nothing).
        api.settle()
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
        assert preview["jobs_to_cancel"] == [] and preview["deployments_to_unload"] == []
        assert len(preview["plan_hash"]) == 64
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
        # The hash is required, and must be the plan's.
        body = {"confirm_node_id": node.node_id, "reason": "retired"}
        execute_url = f"{NODES}/{node.node_id}/decommission"
        refused(client.post(execute_url, json=body, headers=api.admin_headers), 422,
                "validation_failed")  # fmt: skip
        refused(
            decommission(client, api, node.node_id, plan_hash="0" * 64),
            409,
            "decommission_plan_changed",
        )
        ok(beat(client, node))  # still alive after the refused attempts

        result = ok(decommission(client, api, node.node_id, plan_hash=preview["plan_hash"]))
        assert result["node_id"] == node.node_id and result["decommissioned_at"]
        assert result["revoked_credential_ids"] == [credential_id(node.credential)]
        assert result["revoked_enrollment_token_ids"] == [recovery_id]
        assert result["cancelled_job_ids"] == [] and result["unloaded_deployment_ids"] == []

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
    # (The same presence gap as the API already running here: tests/api_server.py.)
    quick = api_factory(stale_after_s=0.1, offline_after_s=0.2)
    with quick.client() as client:
        wait_until(
            lambda: get_node(client, quick, bystander.node_id)["liveness"] == "offline",
            10,
            "the silent bystander offline",
        )
        assert get_node(client, quick, node.node_id)["liveness"] == "decommissioned"
        assert list_nodes(client, quick, {"liveness": "decommissioned"}) == [node.node_id]
        assert list_nodes(client, quick, {"liveness": "offline"}) == [bystander.node_id]


# --------------------------------------------------------------------------- the plan's hash


@pytest.mark.fast
def test_the_plan_hash_is_canonical() -> None:
    """The same plan hashes alike in any order; what a decommission does changes it."""
    node, ids = uuid.uuid4(), [uuid.uuid4() for _ in range(4)]
    job = DecommissionJob(id=ids[2], kind=JobKind.ARTIFACT_ACQUIRE, state=JobState.QUEUED,
                          lease_epoch=0)  # fmt: skip
    other = job.model_copy(update={"id": ids[3]})
    placed = DecommissionDeployment(id=ids[3], model="smol", device_id="cpu",
                                    state=DeploymentState.PENDING)  # fmt: skip
    plan = Plan(node, [ids[0], ids[1]], [], [job, other], [placed])
    same = Plan(node, [ids[1], ids[0]], [], [other, job], [placed])
    assert plan_hash(plan) == plan_hash(same)
    assert re.fullmatch(r"[0-9a-f]{64}", plan_hash(plan))
    claimed_job = job.model_copy(update={"state": JobState.LEASED, "lease_epoch": 1})
    loaded = placed.model_copy(update={"state": DeploymentState.READY})
    for changed in (
        Plan(node, [ids[0]], [], [job, other], [placed]),
        Plan(node, [ids[0], ids[1]], [ids[3]], [job, other], [placed]),
        Plan(node, [ids[0], ids[1]], [], [claimed_job, other], [placed]),
        Plan(node, [ids[0], ids[1]], [], [job, other], [loaded]),
        Plan(uuid.uuid4(), [ids[0], ids[1]], [], [job, other], [placed]),
    ):
        assert plan_hash(changed) != plan_hash(plan), changed


def preview_of(client: httpx.Client, api: RunningApi, node_id: str) -> dict[str, Any]:
    url = f"{NODES}/{node_id}/decommission/preview"
    preview: dict[str, Any] = ok(client.get(url, headers=api.admin_headers))
    return preview


def refused_as_changed(
    client: httpx.Client, api: RunningApi, node: EnrolledNode, stale: dict[str, Any]
) -> None:
    """Execute on a stale preview: 409, and nothing changed (the node still works, its
    plan is what it was just before the attempt)."""
    before = preview_of(client, api, node.node_id)
    assert before["plan_hash"] != stale["plan_hash"]
    outbox = outbox_count(api.settings.database_url)
    refused(
        decommission(client, api, node.node_id, plan_hash=stale["plan_hash"]),
        409,
        "decommission_plan_changed",
    )
    assert outbox_count(api.settings.database_url) == outbox
    assert preview_of(client, api, node.node_id) == before
    assert get_node(client, api, node.node_id)["decommissioned_at"] is None
    ok(beat(client, node))


def test_a_new_credential_changes_the_plan(api: RunningApi) -> None:
    with api.client() as client:
        node = enroll(client, api)
        stale = preview_of(client, api, node.node_id)
        rotate = f"{NODES}/{node.node_id}/credential/rotate"
        rotated = ok(client.post(rotate, headers=api.admin_headers))
        node = EnrolledNode(node.node_id, rotated["credential"])
        refused_as_changed(client, api, node, stale)
        result = ok(decommission(client, api, node.node_id))
        assert result["revoked_credential_ids"] == [credential_id(node.credential)]


def test_a_claimed_job_changes_the_plan_and_execute_cancels_it(api: RunningApi) -> None:
    with api.client() as client:
        node = node_with_roots(client, api)
        job_id = created(client, api, node)
        stale = preview_of(client, api, node.node_id)
        assert [(j["id"], j["state"]) for j in stale["jobs_to_cancel"]] == [(job_id, "queued")]
        claimed(client, node)
        refused_as_changed(client, api, node, stale)
        assert get_job(client, api, job_id)["state"] == "leased"

        fresh = preview_of(client, api, node.node_id)
        assert [(j["id"], j["state"]) for j in fresh["jobs_to_cancel"]] == [(job_id, "leased")]
        result = ok(decommission(client, api, node.node_id, plan_hash=fresh["plan_hash"]))
        assert result["cancelled_job_ids"] == [job_id]
        assert get_job(client, api, job_id)["state"] == "cancelled"


def test_a_loaded_deployment_changes_the_plan_and_execute_unloads_it(api: RunningApi) -> None:
    with api.client() as client:
        node = ready_node(client, api)
        profile = create_profile(client, api)
        body = deployment_body(node, profile["id"], environment_id(client, api))
        pending = create_deployment(client, api, body)
        stale = preview_of(client, api, node.node_id)
        assert [(d["id"], d["state"]) for d in stale["deployments_to_unload"]] == [
            (pending["id"], "pending")
        ]
        claim = claim_deployment_job(client, node)
        assert complete_load(client, node, claim).status_code == 200
        assert deployment(client, api, pending["id"])["state"] == "ready"
        refused_as_changed(client, api, node, stale)
        assert deployment(client, api, pending["id"])["state"] == "ready"

        result = ok(decommission(client, api, node.node_id))
        assert result["unloaded_deployment_ids"] == [pending["id"]]
        assert deployment(client, api, pending["id"])["state"] == "unloaded"


async def test_concurrent_executes_of_one_plan_decommission_once(api: RunningApi) -> None:
    with api.client() as client:
        node = node_with_roots(client, api)
        job_id = created(client, api, node)
        body = decommission_body(client, api.admin_headers, node.node_id)
    url = f"{NODES}/{node.node_id}/decommission"
    async with api.async_client() as client:
        responses = await released_together(
            RACERS, lambda _: client.post(url, json=body, headers=api.admin_headers)
        )
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200] + [409] * (RACERS - 1), [r.text for r in responses]
    assert {r.json()["code"] for r in responses if r.status_code == 409} == {"node_terminal"}
    with api.client() as client:
        assert get_job(client, api, job_id)["state"] == "cancelled"
        assert len(audit(client, api, action="node.decommissioned")) == 1


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
