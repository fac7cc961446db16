"""Artifact evictions (artifact.evict.v1) through the real API and PostgreSQL: what an
operator may evict, what refuses it (409 while a deployment or a queued or leased job
uses the artifact), the lease a node claims and how its completion takes the artifact
out of the node's inventory. The node's side (verify, delete, never through a symlink)
is tests/agent/test_artifact_evict.py."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from schemas.artifacts import ArtifactJobList, EvictJobView
from schemas.protocol import ARTIFACT_JOB_COMPLETE, ARTIFACT_JOBS, AUDIT, DEPLOYMENTS, NODES
from tests import deployment_flows as deployments
from tests import runtime_flows as runtime
from tests.admin_helpers import ok, refused
from tests.api_server import ApiFactory, RunningApi
from tests.artifact_flows import (
    COMMIT,
    MANIFEST,
    REPOSITORY,
    ROOT,
    claim,
    claimed,
    fence,
    get_job,
    node_with_roots,
)
from tests.artifact_flows import complete as complete_acquisition
from tests.artifact_flows import create_job as create_acquisition
from tests.cli_support import ONE_LINE_ERROR, Admin
from tests.cli_support import ok as ran
from tests.flows import EnrolledNode

EVICT = "artifact.evict.v1"
pytest_plugins = ["tests.cli_fixtures"]


@pytest.fixture
def evict_api(api_factory: ApiFactory) -> RunningApi:
    return api_factory(job_retry_base_s=0.1, job_lease_s=30)


def evict(client: httpx.Client, api: RunningApi, node: EnrolledNode, **body: Any) -> httpx.Response:
    return client.post(
        f"{NODES}/{node.node_id}/artifacts/evict",
        json={"repository": REPOSITORY, "commit": COMMIT, **body},
        headers=api.admin_headers,
    )


def evict_report(lease: dict[str, Any], files: list[dict[str, Any]] | None = None) -> Any:
    return {"kind": EVICT, "lease": lease, "files": MANIFEST["files"] if files is None else files}


def complete_eviction(
    client: httpx.Client, node: EnrolledNode, job_id: str, body: dict[str, Any]
) -> httpx.Response:
    path = ARTIFACT_JOB_COMPLETE.format(job_id=job_id)
    return client.post(path, json=body, headers=node.headers)


def inventory(client: httpx.Client, api: RunningApi, node: EnrolledNode) -> list[Any]:
    items: list[Any] = ok(
        client.get(f"{NODES}/{node.node_id}/artifacts", headers=api.admin_headers)
    )["items"]
    return items


def holding(client: httpx.Client, api: RunningApi, hostname: str = "gpu-host-1") -> EnrolledNode:
    """A node whose inventory holds the artifact, its binary reported (a deployment or a
    probe can use it)."""
    return runtime.ready_node(client, api, hostname=hostname)


def profile_and_environment(client: httpx.Client, api: RunningApi) -> tuple[str, str]:
    return runtime.create_profile(client, api)["id"], runtime.environment_id(client, api)


def actions(api: RunningApi, job_id: str) -> list[str]:
    """The job's events, as the audit log (written from them by the workers) shows them."""
    api.settle()
    with api.client() as client:
        found = ok(client.get(AUDIT, params={"target_id": job_id}, headers=api.admin_headers))
    return [row["action"] for row in reversed(found["items"])]


def test_an_eviction_leaves_the_inventory_with_its_event(evict_api: RunningApi) -> None:
    api = evict_api
    with api.client() as client:
        node = holding(client, api)
        job = ok(evict(client, api, node), 201)
        assert job["kind"] == EVICT and job["state"] == "queued" and job["progress"] is None
        assert job["spec"] == {
            "repository": REPOSITORY,
            "commit": COMMIT,
            "files": MANIFEST["files"],
            "target_root": ROOT,
        }
        # The dashboard's jobs view reads this list: the eviction is in it, by its kind.
        listed = ok(client.get(ARTIFACT_JOBS, headers=api.admin_headers))["items"]
        assert [j["kind"] for j in listed if j["id"] == job["id"]] == [EVICT]
        lease = claimed(client, node)
        assert lease["kind"] == EVICT and lease["spec"] == job["spec"]
        # An acquisition's report (no kind) is not an eviction's: refused, nothing changes.
        wrong = complete_acquisition(client, node, job["id"], fence(lease))
        refused(wrong, 422, "validation_failed")
        assert len(inventory(client, api, node)) == 1
        answer = ok(complete_eviction(client, node, job["id"], evict_report(fence(lease))))
        assert answer == {"job_id": job["id"], "state": "succeeded", "mismatches": []}
        assert inventory(client, api, node) == []
        done = get_job(client, api, job["id"])
        assert done["result"] == {"root": ROOT, "repository": REPOSITORY, "commit": COMMIT}
        # Gone from the inventory: nothing left to evict.
        refused(evict(client, api, node), 404, "artifact_not_on_node")
    assert actions(api, job["id"]) == ["job.created", "job.claimed", "job.completed"]


def test_a_report_that_does_not_match_keeps_the_artifact(evict_api: RunningApi) -> None:
    api = evict_api
    with api.client() as client:
        node = holding(client, api)
        job_id = ok(evict(client, api, node, target_root=ROOT), 201)["id"]
        short = evict_report(fence(claimed(client, node)), MANIFEST["files"][:1])
        answer = ok(complete_eviction(client, node, job_id, short))
        assert answer["state"] == "failed" and answer["mismatches"] == ["model.gguf: missing"]
        assert get_job(client, api, job_id)["failure"]["code"] == "inventory_mismatch"
        assert [a["commit"] for a in inventory(client, api, node)] == [COMMIT]


def test_what_is_not_in_the_inventory_is_404(evict_api: RunningApi) -> None:
    api = evict_api
    with api.client() as client:
        bare = node_with_roots(client, api, hostname="bare")
        refused(evict(client, api, bare), 404, "artifact_not_on_node")
        node = holding(client, api)
        refused(evict(client, api, node, target_root="/srv/other"), 404, "artifact_not_on_node")
        refused(evict(client, api, node, commit="f" * 40), 404, "artifact_not_on_node")
        nobody = EnrolledNode(node_id="00000000-0000-4000-8000-000000000000", credential="")
        refused(evict(client, api, nobody), 404, "not_found")
        for wrong in ({"commit": "HEAD"}, {"target_root": "../etc"}, {"repository": "../x"}):
            refused(evict(client, api, node, **wrong), 422, "validation_failed")


def test_refused_while_a_deployment_uses_it(evict_api: RunningApi) -> None:
    api = evict_api
    with api.client() as client:
        node = holding(client, api)
        profile_id, environment = profile_and_environment(client, api)
        body = deployments.deployment_body(node, profile_id, environment, max_attempts=1)
        deployment_id = deployments.create_deployment(client, api, body)["id"]
        in_use = refused(evict(client, api, node), 409, "state_conflict")
        load = deployments.claim_deployment_job(client, node)
        # The deployment, and its load job (queued then).
        assert in_use["extra"]["used_by"] == [
            f"deployment {deployment_id} (pending)",
            f"job {load['job_id']} (deployment.load.v1, queued)",
        ]
        # Its load fails for good: the deployment ended, nothing uses the artifact.
        deployments.fail_deployment_job(client, node, load, "startup_timeout", retryable=False)
        assert deployments.deployment(client, api, deployment_id)["state"] == "failed"
        assert ok(evict(client, api, node), 201)["kind"] == EVICT


def test_refused_while_a_leased_runtime_job_uses_it(evict_api: RunningApi) -> None:
    api = evict_api
    with api.client() as client:
        node = holding(client, api)
        body = runtime.probe_body(node, *profile_and_environment(client, api), max_attempts=1)
        probe_id = ok(runtime.create_probe(client, api, body), 201)["id"]
        refused(evict(client, api, node), 409, "state_conflict")
        leased = ok(runtime.claim_runtime_job(client, node))
        in_use = refused(evict(client, api, node), 409, "state_conflict")
        assert in_use["extra"]["used_by"] == [f"job {probe_id} (runtime.probe.v1, leased)"]
        ended = runtime.fail_runtime_job(
            client, node, probe_id, fence(leased), "startup_timeout", retryable=False
        )
        assert ok(ended)["state"] == "failed"
        assert ok(evict(client, api, node), 201)["kind"] == EVICT


def test_a_probe_or_deployment_of_an_artifact_being_evicted_is_refused(
    evict_api: RunningApi,
) -> None:
    """The other way round: once an eviction is queued, nothing new may load its files
    (the node's lock orders the two), until it is cancelled or ends."""
    api = evict_api
    with api.client() as client:
        node = holding(client, api)
        profile_id, environment = profile_and_environment(client, api)
        eviction = ok(evict(client, api, node), 201)["id"]
        probe = runtime.probe_body(node, profile_id, environment, max_attempts=1)
        being_evicted = refused(runtime.create_probe(client, api, probe), 409, "state_conflict")
        assert being_evicted["extra"]["evicted_by"] == eviction
        load = deployments.deployment_body(node, profile_id, environment, max_attempts=1)
        refused(
            client.post(DEPLOYMENTS, json=load, headers=api.admin_headers), 409, "state_conflict"
        )
        ok(client.post(f"{ARTIFACT_JOBS}/{eviction}/cancel", headers=api.admin_headers))
        assert runtime.create_probe(client, api, probe).status_code == 201
        deployments.create_deployment(client, api, load)


def test_an_eviction_and_an_acquisition_exclude_each_other(evict_api: RunningApi) -> None:
    api = evict_api
    with api.client() as client:
        node = holding(client, api)
        eviction = ok(evict(client, api, node), 201)["id"]
        refused(create_acquisition(client, api, node), 409, "state_conflict")
        refused(evict(client, api, node), 409, "state_conflict")
        ok(client.post(f"{ARTIFACT_JOBS}/{eviction}/cancel", headers=api.admin_headers))
        acquisition = ok(create_acquisition(client, api, node), 201)["id"]
        in_use = refused(evict(client, api, node), 409, "state_conflict")
        assert in_use["extra"]["used_by"] == [f"job {acquisition} (artifact.acquire.v1, queued)"]


def test_another_nodes_credential_cannot_evict_or_report(evict_api: RunningApi) -> None:
    api = evict_api
    with api.client() as client:
        owner = holding(client, api, hostname="owner")
        intruder = node_with_roots(client, api, hostname="intruder")
        # The intruder's inventory holds nothing of the owner's.
        refused(evict(client, api, intruder), 404, "artifact_not_on_node")
        job_id = ok(evict(client, api, owner), 201)["id"]
        assert claim(client, intruder).status_code == 204
        report = evict_report(fence(claimed(client, owner)))
        refused(complete_eviction(client, intruder, job_id, report), 403, "job_not_owned")
        assert [a["commit"] for a in inventory(client, api, owner)] == [COMMIT]
        # A node's credential is not the operator's.
        as_node = client.post(
            f"{NODES}/{owner.node_id}/artifacts/evict",
            json={"repository": REPOSITORY, "commit": COMMIT},
            headers=intruder.headers,
        )
        assert as_node.status_code == 401
        ok(complete_eviction(client, owner, job_id, report))
        assert inventory(client, api, owner) == []


def test_the_cli_verb_evicts_and_its_refusals_are_one_line(admin: Admin, api: RunningApi) -> None:
    with api.client() as client:
        node = holding(client, api)
    artifact = f"{REPOSITORY}@{COMMIT}"
    evicted = ran(admin("jobs", "evict", node.node_id, artifact, "--json"))
    job = EvictJobView.model_validate_json(evicted)
    assert job.kind == EVICT and job.spec.target_root == ROOT and job.state == "queued"
    # Listed and shown with the acquisition that put it there, each by its kind.
    listed = ArtifactJobList.model_validate_json(ran(admin("jobs", "list", "--json")))
    assert sorted(j.kind.value for j in listed.items) == ["artifact.acquire.v1", EVICT]
    assert "evict" in ran(admin("jobs", "get", str(job.id)))
    # The API's 409 (an eviction of it is queued already) and 404, as one line each.
    unknown = f"{REPOSITORY}@{'e' * 40}"
    for other, code in ((artifact, "state_conflict"), (unknown, "artifact_not_on_node")):
        refusal = admin("jobs", "evict", node.node_id, other)
        match = ONE_LINE_ERROR.match(refusal.stderr.strip())
        assert refusal.returncode == 1 and match and match["code"] == code, refusal.stderr
    # Not REPOSITORY@COMMIT, or a root that is not absolute: a usage line, no round trip.
    for wrong in (("nonsense",), (f"{REPOSITORY}@main",), (artifact, "--root", "relative")):
        usage = admin("jobs", "evict", node.node_id, *wrong)
        assert usage.returncode == 2 and "REPOSITORY@COMMIT" in usage.stderr, usage.stderr
        assert "Traceback" not in usage.stderr
