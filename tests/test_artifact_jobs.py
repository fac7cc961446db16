"""Artifact acquisition jobs through the real API and PostgreSQL: what an operator may
create, the lease a node claims, and how progress, completion, failure, retries and
cancellation settle under the fence. The agent's side (downloads) has its own tests."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from schemas.protocol import ARTIFACT_JOBS, NODES
from tests.admin_helpers import decommission, ok, patch_node, refused
from tests.api_server import ApiFactory, RunningApi
from tests.artifact_flows import (
    MANIFEST,
    ROOT,
    claim,
    claimed,
    complete,
    create_job,
    created,
    fail,
    fence,
    get_job,
    node_with_roots,
    progress,
)
from tests.flows import enroll
from tests.services import db_fetch


@pytest.fixture
def jobs_api(api_factory: ApiFactory) -> RunningApi:
    # Backoff short enough to watch a retry become claimable.
    return api_factory(job_retry_base_s=0.2, job_retry_max_s=0.5, job_lease_s=30)


async def job_events(database_url: str, job_id: str) -> list[str]:
    rows = await db_fetch(
        database_url,
        "SELECT envelope->>'action' AS action FROM outbox WHERE subject LIKE $1 ORDER BY position",
        f"modelforge.v1.job.{job_id}.%",
    )
    return [row["action"] for row in rows]


# ------------------------------------------------------------------------------ creation


def test_an_exact_job_is_queued_listed_and_audited(jobs_api: RunningApi) -> None:
    api = jobs_api
    with api.client() as client:
        node = node_with_roots(client, api)
        job = ok(create_job(client, api, node, reserve={"min_free_bytes": 1024}), 201)
        assert job["state"] == "queued" and job["attempt"] == 0 and job["lease"] is None
        assert job["spec"] == {
            "repository": MANIFEST["repository"],
            "commit": MANIFEST["commit"],
            "files": MANIFEST["files"],
            "target_root": ROOT,
            "reserve": {"min_free_bytes": 1024},
        }
        assert get_job(client, api, job["id"]) == job
        other = node_with_roots(client, api, hostname="gpu-host-2")
        created(client, api, other)
        mine = ok(
            client.get(ARTIFACT_JOBS, params={"node_id": node.node_id}, headers=api.admin_headers)
        )
        assert [j["id"] for j in mine["items"]] == [job["id"]]
        queued = ok(
            client.get(ARTIFACT_JOBS, params={"state": "queued"}, headers=api.admin_headers)
        )
        assert len(queued["items"]) == 2
        done = ok(
            client.get(ARTIFACT_JOBS, params={"state": "succeeded"}, headers=api.admin_headers)
        )
        assert done["items"] == []
        api.settle()
        audit = ok(
            client.get(
                "/api/v1/admin/audit",
                params={"target_type": "job", "target_id": job["id"]},
                headers=api.admin_headers,
            )
        )
        assert [e["action"] for e in audit["items"]] == ["job.created"]
        assert audit["items"][0]["actor"] == "operator"


def test_creation_refuses_what_the_node_cannot_take(jobs_api: RunningApi) -> None:
    api = jobs_api
    with api.client() as client:
        node = node_with_roots(client, api)
        body = refused(
            create_job(client, api, node, target_root="/var/lib/other"),
            422,
            "target_root_not_allowed",
        )
        assert body["extra"]["allowed_roots"] == [ROOT]
        bare = enroll(client, api, hostname="no-inventory")
        refused(create_job(client, api, bare), 422, "target_root_not_allowed")
        ghost = type(node)(node_id="00000000-0000-4000-8000-000000000000", credential="")
        refused(create_job(client, api, ghost), 404, "not_found")
        assert patch_node(client, api, node.node_id, enabled=False).status_code == 200
        refused(create_job(client, api, node), 409, "node_not_schedulable")
        assert patch_node(client, api, node.node_id, enabled=True).status_code == 200
        decommission(client, api, node.node_id)
        refused(create_job(client, api, node), 409, "node_not_schedulable")


@pytest.mark.parametrize(
    "change",
    [
        {"manifest": {**MANIFEST, "commit": "main"}},
        {"manifest": {**MANIFEST, "commit": "0" * 39}},
        {"manifest": {**MANIFEST, "files": [{**MANIFEST["files"][0], "path": "../etc/passwd"}]}},
        {"manifest": {**MANIFEST, "files": [{**MANIFEST["files"][0], "path": "/etc/passwd"}]}},
        {"manifest": {**MANIFEST, "files": [MANIFEST["files"][0], MANIFEST["files"][0]]}},
        {"manifest": {**MANIFEST, "files": []}},
        {"target_root": "/srv/../etc"},
        {"target_root": "srv/models"},
        {"resolve": {"repository": "acme/x", "patterns": ["*.gguf"]}},  # and a manifest
        {"manifest": None},
        {"manifest": {**MANIFEST, "command": "rm -rf /"}},
        {"url": "http://example.com/model.gguf"},
        {"max_attempts": 0},
        {
            "manifest": {
                **MANIFEST,
                "files": [
                    {**MANIFEST["files"][0], "digest": {"algorithm": "sha256", "value": "ab" * 20}}
                ],
            }
        },
    ],
)
def test_malformed_jobs_are_422(jobs_api: RunningApi, change: dict[str, Any]) -> None:
    api = jobs_api
    with api.client() as client:
        node = node_with_roots(client, api)
        refused(create_job(client, api, node, **change), 422, "validation_failed")


# ------------------------------------------------------------------------ claim and report


def test_claim_progress_complete_records_the_artifact(jobs_api: RunningApi) -> None:
    api = jobs_api
    with api.client() as client:
        node = node_with_roots(client, api)
        assert claim(client, node).status_code == 204
        job_id = created(client, api, node)
        lease = claimed(client, node)
        assert lease["job_id"] == job_id and lease["attempt"] == 1
        assert lease["lease"]["epoch"] == 1 and lease["spec"]["files"] == MANIFEST["files"]
        assert claim(client, node).status_code == 204  # one job, one holder
        first_expiry = lease["lease"]["expires_at"]
        time.sleep(0.05)  # the clock moves on, so the extension is visible: not a wait
        answer = ok(progress(client, node, job_id, fence(lease), 2500))
        assert answer["cancel_requested"] is False
        assert answer["lease"]["expires_at"] > first_expiry  # extended
        view = get_job(client, api, job_id)
        assert view["state"] == "leased" and view["progress"]["bytes_done"] == 2500
        assert view["progress"]["bytes_total"] == 4300
        done = ok(complete(client, node, job_id, fence(lease)))
        assert done == {"job_id": job_id, "state": "succeeded", "mismatches": []}
        artifacts = ok(client.get(f"{NODES}/{node.node_id}/artifacts", headers=api.admin_headers))
        [artifact] = artifacts["items"]
        assert artifact["root"] == ROOT and artifact["commit"] == MANIFEST["commit"]
        assert artifact["files"] == MANIFEST["files"] and artifact["job_id"] == job_id
        # A finished job takes no more reports.
        refused(progress(client, node, job_id, fence(lease), 10), 409, "job_finished")


async def test_lifecycle_events(jobs_api: RunningApi, database_url: str) -> None:
    api = jobs_api
    with api.client() as client:
        node = node_with_roots(client, api)
        job_id = created(client, api, node)
        lease = claimed(client, node)
        for done in (500, 1200, 2200, 2300, 3400, 4000):
            ok(progress(client, node, job_id, fence(lease), done))
        ok(complete(client, node, job_id, fence(lease)))
    assert await job_events(database_url, job_id) == [
        "job.created",
        "job.claimed",
        "job.progressed",  # 25 % of 4,300 bytes (1,200 of model.gguf)
        "job.progressed",  # 50 %
        "job.progressed",  # 75 %
        "job.completed",
    ]


def test_a_mismatched_inventory_fails_the_job(jobs_api: RunningApi) -> None:
    api = jobs_api
    with api.client() as client:
        node = node_with_roots(client, api)
        job_id = created(client, api, node)
        lease = claimed(client, node)
        wrong = [dict(MANIFEST["files"][0]), {**MANIFEST["files"][1], "size": 1}]
        answer = ok(complete(client, node, job_id, fence(lease), wrong))
        assert answer["state"] == "failed"
        assert answer["mismatches"] == ["model.gguf: size 1, expected 4000"]
        failure = get_job(client, api, job_id)["failure"]
        assert failure["code"] == "inventory_mismatch" and failure["retryable"] is False
        assert ok(client.get(f"{NODES}/{node.node_id}/artifacts", headers=api.admin_headers)) == {
            "items": []
        }


def test_retryable_failures_back_off_and_fence_the_old_lease(api_factory: ApiFactory) -> None:
    # A backoff of seconds: the claim right after the fail lands inside it however
    # loaded the machine (0.2 s was not always enough).
    api = api_factory(job_retry_base_s=3, job_retry_max_s=3, job_lease_s=30)
    with api.client() as client:
        node = node_with_roots(client, api)
        job_id = created(client, api, node, max_attempts=2)
        first = claimed(client, node)
        answer = ok(fail(client, node, job_id, fence(first), "source_unavailable", retryable=True))
        assert answer["state"] == "queued" and answer["retry_at"] is not None
        assert claim(client, node).status_code == 204  # backing off
        deadline = time.monotonic() + 15
        while (response := claim(client, node)).status_code == 204:
            assert time.monotonic() < deadline, "the retry never became claimable"
            time.sleep(0.05)
        second = response.json()
        assert second["attempt"] == 2 and second["lease"]["epoch"] == 2
        # The first holder is fenced off, whatever it reports.
        refused(progress(client, node, job_id, fence(first), 10), 409, "lease_stale")
        refused(complete(client, node, job_id, fence(first)), 409, "lease_stale")
        refused(
            fail(client, node, job_id, fence(first), "internal", retryable=False),
            409,
            "lease_stale",
        )
        # The last attempt: a retryable failure now ends the job.
        final = ok(fail(client, node, job_id, fence(second), "source_unavailable", retryable=True))
        assert final == {"job_id": job_id, "state": "failed", "retry_at": None}
        view = get_job(client, api, job_id)
        assert view["failure"]["code"] == "source_unavailable" and view["attempt"] == 2


def test_a_non_retryable_failure_ends_the_job(jobs_api: RunningApi) -> None:
    api = jobs_api
    with api.client() as client:
        node = node_with_roots(client, api)
        job_id = created(client, api, node, max_attempts=5)
        lease = claimed(client, node)
        answer = ok(fail(client, node, job_id, fence(lease), "checksum_mismatch", retryable=False))
        assert answer["state"] == "failed"
        # Codes the control plane decides are not the node's to report.
        other = created(client, api, node)
        lease = claimed(client, node)
        refused(
            fail(client, node, other, fence(lease), "lease_expired", retryable=True),
            422,
            "validation_failed",
        )


def test_cancel_queued_ends_it_cancel_leased_tells_the_holder(jobs_api: RunningApi) -> None:
    api = jobs_api
    with api.client() as client:
        node = node_with_roots(client, api)
        queued = created(client, api, node)
        cancelled = ok(client.post(f"{ARTIFACT_JOBS}/{queued}/cancel", headers=api.admin_headers))
        assert cancelled["state"] == "cancelled"
        refused(
            client.post(f"{ARTIFACT_JOBS}/{queued}/cancel", headers=api.admin_headers),
            409,
            "job_finished",
        )
        assert claim(client, node).status_code == 204

        job_id = created(client, api, node)
        lease = claimed(client, node)
        requested = ok(client.post(f"{ARTIFACT_JOBS}/{job_id}/cancel", headers=api.admin_headers))
        assert requested["state"] == "leased" and requested["cancel_requested"] is True
        assert ok(progress(client, node, job_id, fence(lease), 100))["cancel_requested"] is True
        # Whatever the holder reports next, the job ends cancelled: even a retryable code.
        answer = ok(fail(client, node, job_id, fence(lease), "stalled", retryable=True))
        assert answer["state"] == "cancelled"
        assert get_job(client, api, job_id)["failure"]["code"] == "cancelled"
        refused(
            client.post(
                f"{ARTIFACT_JOBS}/00000000-0000-4000-8000-000000000000/cancel",
                headers=api.admin_headers,
            ),
            404,
            "not_found",
        )


# ------------------------------------------------------------------------------ isolation


def test_another_nodes_credential_can_never_claim_see_or_report(jobs_api: RunningApi) -> None:
    api = jobs_api
    with api.client() as client:
        owner = node_with_roots(client, api, hostname="owner")
        intruder = node_with_roots(client, api, hostname="intruder")
        job_id = created(client, api, owner)
        assert claim(client, intruder).status_code == 204
        lease = claimed(client, owner)
        stolen = fence(lease)
        refused(progress(client, intruder, job_id, stolen, 10), 403, "job_not_owned")
        refused(complete(client, intruder, job_id, stolen), 403, "job_not_owned")
        refused(
            fail(client, intruder, job_id, stolen, "internal", retryable=False),
            403,
            "job_not_owned",
        )
        refused(
            progress(client, owner, "00000000-0000-4000-8000-000000000000", stolen, 1),
            404,
            "not_found",
        )
        # The owner's work is untouched.
        view = get_job(client, api, job_id)
        assert view["state"] == "leased" and view["progress"] is None
        ok(complete(client, owner, job_id, stolen))
        no_key = client.get(ARTIFACT_JOBS)
        assert no_key.status_code == 401
        as_node = client.get(ARTIFACT_JOBS, headers=owner.headers)
        assert as_node.status_code == 401
        assert httpx.codes.is_success(
            client.get(ARTIFACT_JOBS, headers=api.admin_headers).status_code
        )
