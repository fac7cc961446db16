"""The runtime through the real API and PostgreSQL: profiles as immutable versions, the
runtime report stream and the environments it reveals, and runtime.probe.v1 jobs under
the shared leases: creation against the node's artifact inventory and binaries, claim,
fencing, completion with evidence, typed failure. The runtime worker's side has its
own tests (tests/runtime/)."""

from __future__ import annotations

import time

import httpx
import pytest

from schemas.protocol import (
    NODES,
    RUNTIME,
    RUNTIME_EVIDENCE,
    RUNTIME_JOBS,
    RUNTIME_JOBS_NEXT,
    RUNTIME_PROFILES,
)
from tests.admin_helpers import ok, patch_node, refused
from tests.api_server import ApiFactory, RunningApi
from tests.artifact_flows import fence, node_with_roots
from tests.flows import released_together
from tests.runtime_flows import (
    ARTIFACT_PATH,
    ARTIFACT_SHA256,
    BINARY_SHA256,
    claim_runtime_job,
    complete_probe,
    create_probe,
    create_profile,
    environment_id,
    evidence_report,
    fail_runtime_job,
    probe_body,
    ready_node,
    report_runtime,
    runtime_job,
    runtime_report,
)


@pytest.fixture
def runtime_api(api_factory: ApiFactory) -> RunningApi:
    return api_factory(job_retry_base_s=0.2, job_retry_max_s=0.5, job_lease_s=30)


# ------------------------------------------------------------------------------ profiles


def test_a_profile_change_is_a_new_version_and_the_old_one_stays(runtime_api: RunningApi) -> None:
    api = runtime_api
    with api.client() as client:
        first = create_profile(client, api, "planner", ctx_size=4096)
        second = create_profile(client, api, "planner", ctx_size=8192)
        assert (first["version"], second["version"]) == (1, 2)
        assert first["id"] != second["id"]
        again = ok(client.get(f"{RUNTIME_PROFILES}/{first['id']}", headers=api.admin_headers))
        assert again["settings"]["ctx_size"] == 4096
        listed = ok(
            client.get(RUNTIME_PROFILES, params={"name": "planner"}, headers=api.admin_headers)
        )
        assert [p["version"] for p in listed["items"]] == [1, 2]
        bad = client.post(
            RUNTIME_PROFILES,
            json={"name": "x", "settings": {"server_args": {"host": "0.0.0.0"}}},  # noqa: S104
            headers=api.admin_headers,
        )
        refused(bad, 422, "server_flag_refused")
        assert bad.json()["extra"]["flags"] == ["host"]


async def test_concurrent_versions_of_one_profile_are_distinct_and_gapless(
    runtime_api: RunningApi,
) -> None:
    api = runtime_api
    async with httpx.AsyncClient(base_url=api.base_url, timeout=30) as client:

        async def send(index: int) -> httpx.Response:
            body = {"name": "raced", "settings": {"threads": index + 1}}
            return await client.post(RUNTIME_PROFILES, json=body, headers=api.admin_headers)

        answers = await released_together(12, send)
    assert all(a.status_code == 201 for a in answers), [a.text for a in answers]
    assert sorted(a.json()["version"] for a in answers) == list(range(1, 13))


# ------------------------------------------------------------------------------ reports


def test_the_runtime_report_is_a_stream_of_its_own(runtime_api: RunningApi) -> None:
    api = runtime_api
    with api.client() as client:
        node = node_with_roots(client, api)
        assert ok(client.get(f"{NODES}/{node.node_id}/runtime", headers=api.admin_headers)) == {
            "devices": [], "served_models": [], "loaded_models": [], "deployments": [],
            "environments": [], "reported": False,
        }  # fmt: skip
        applied = ok(report_runtime(client, node, 5))
        assert applied["stream"] == "runtime" and applied["applied"] is True
        refused(report_runtime(client, node, 5), 409, "sequence_replayed")
        view = ok(client.get(f"{NODES}/{node.node_id}/runtime", headers=api.admin_headers))
        assert view["reported"] is True
        assert view["served_models"] == [{"model_id": "smol", "roles": ["planner"]}]
        assert environment_id(client, api)
        other = node_with_roots(client, api, hostname="gpu-host-2")
        stolen = client.put(RUNTIME, json=runtime_report(node, 9), headers=other.headers)
        refused(stolen, 403, "node_mismatch")


# ------------------------------------------------------------------------------ probes


def test_a_probe_carries_only_exact_resolved_values(runtime_api: RunningApi) -> None:
    api = runtime_api
    with api.client() as client:
        node = ready_node(client, api)
        profile = create_profile(client, api)
        body = probe_body(node, profile["id"], environment_id(client, api))
        probe = ok(create_probe(client, api, body), 201)
        assert probe["state"] == "queued"
        spec = probe["spec"]
        assert spec["artifact_path"] == ARTIFACT_PATH
        assert spec["artifact_digest"] == ARTIFACT_SHA256
        assert spec["binary_sha256"] == BINARY_SHA256
        assert spec["profile_version"] == 1 and spec["settings"]["ctx_size"] == 512
        assert spec["prompt"] and spec["max_tokens"] == 8
        smuggled = {**body, "command": "rm -rf /"}
        refused(create_probe(client, api, smuggled), 422, "validation_failed")


def test_a_probe_for_what_the_node_lacks_is_refused(runtime_api: RunningApi) -> None:
    api = runtime_api
    with api.client() as client:
        node = ready_node(client, api)
        profile = create_profile(client, api)
        environment = environment_id(client, api)
        bare = node_with_roots(client, api, hostname="bare")
        refused(
            create_probe(client, api, probe_body(bare, profile["id"], environment)),
            422, "environment_not_on_node",
        )  # fmt: skip
        assert report_runtime(client, bare).status_code == 200
        refused(
            create_probe(client, api, probe_body(bare, profile["id"], environment)),
            422, "artifact_not_on_node",
        )  # fmt: skip
        unknown = "00000000-0000-4000-8000-000000000000"
        refused(create_probe(client, api, probe_body(node, unknown, environment)), 422,
                "profile_unknown")  # fmt: skip
        refused(create_probe(client, api, probe_body(node, profile["id"], unknown)), 422,
                "environment_unknown")  # fmt: skip
        assert patch_node(client, api, node.node_id, enabled=False).status_code == 200
        refused(
            create_probe(client, api, probe_body(node, profile["id"], environment)),
            409, "node_not_schedulable",
        )  # fmt: skip


def test_claim_fence_and_evidence(runtime_api: RunningApi) -> None:
    api = runtime_api
    with api.client() as client:
        node = ready_node(client, api)
        other = ready_node(client, api, hostname="gpu-host-2")
        profile = create_profile(client, api)
        body = probe_body(node, profile["id"], environment_id(client, api))
        probe = ok(create_probe(client, api, body), 201)
        assert claim_runtime_job(client, other).status_code == 204, "another node's probe"
        claim = ok(claim_runtime_job(client, node))
        assert claim["kind"] == "runtime.probe.v1" and claim["job_id"] == probe["id"]
        assert claim_runtime_job(client, node).status_code == 204, "leased: nobody else gets it"
        lease = fence(claim)
        refused(complete_probe(client, other, probe["id"], lease), 403, "job_not_owned")
        stale = {**lease, "epoch": lease["epoch"] + 1}
        refused(complete_probe(client, node, probe["id"], stale), 409, "lease_stale")
        done = ok(complete_probe(client, node, probe["id"], lease))
        assert done["state"] == "succeeded"
        refused(complete_probe(client, node, probe["id"], lease), 409, "job_finished")
        [evidence] = ok(
            client.get(
                RUNTIME_EVIDENCE, params={"node_id": node.node_id}, headers=api.admin_headers
            )
        )["items"]
        assert evidence["device_id"] == "cpu"
        assert evidence["artifact_digest"] == ARTIFACT_SHA256
        assert evidence["profile_id"] == profile["id"]
        assert evidence["evidence"]["generation_tokens_per_s"] == 60.0
        assert evidence["health"]["inference_ok"] is True
        assert evidence["job_id"] == probe["id"]
        # The job keeps what it measured, though later evidence may replace the latest.
        result = runtime_job(client, api, probe["id"])["result"]
        assert result["device_id"] == "cpu" and result["health"] == evidence["health"]
        assert result["evidence"] == evidence["evidence"]


def test_a_typed_failure_retries_or_ends(runtime_api: RunningApi) -> None:
    api = runtime_api
    with api.client() as client:
        node = ready_node(client, api)
        profile = create_profile(client, api)
        body = probe_body(node, profile["id"], environment_id(client, api), max_attempts=2)
        probe = ok(create_probe(client, api, body), 201)
        claim = ok(claim_runtime_job(client, node))
        retry = ok(fail_runtime_job(client, node, probe["id"], fence(claim), "startup_timeout",
                              retryable=True))  # fmt: skip
        assert retry["state"] == "queued" and retry["retry_at"]
        unknown = fail_runtime_job(
            client, node, probe["id"], fence(claim), "no_such_code", retryable=False
        )
        refused(unknown, 422, "validation_failed")
        second = None
        for _ in range(50):
            response = claim_runtime_job(client, node)
            if response.status_code == 200:
                second = response.json()
                break
            time.sleep(0.1)
        assert second is not None and second["attempt"] == 2
        final = ok(fail_runtime_job(client, node, probe["id"], fence(second),
                              "artifact_digest_mismatch", retryable=False))  # fmt: skip
        assert final["state"] == "failed"
        view = runtime_job(client, api, probe["id"])
        assert view["failure"]["code"] == "artifact_digest_mismatch"


async def test_twenty_concurrent_claims_of_a_probe_have_one_winner(
    runtime_api: RunningApi,
) -> None:
    api = runtime_api
    with api.client() as client:
        node = ready_node(client, api)
        profile = create_profile(client, api)
        body = probe_body(node, profile["id"], environment_id(client, api))
        ok(create_probe(client, api, body), 201)
    async with httpx.AsyncClient(base_url=api.base_url, timeout=30) as agent:

        async def send(_: int) -> httpx.Response:
            return await agent.get(RUNTIME_JOBS_NEXT, headers=node.headers)

        answers = await released_together(20, send)
    assert sorted(a.status_code for a in answers) == [200] + [204] * 19


def test_health_and_unload_jobs_for_a_reported_device(runtime_api: RunningApi) -> None:
    api = runtime_api
    with api.client() as client:
        node = ready_node(client, api)
        missing = {"kind": "runtime.unload.v1", "node_id": node.node_id, "device_id": "gpu:7"}
        refused(create_probe(client, api, missing), 422, "device_not_on_node")
        body = {"kind": "runtime.health.v1", "node_id": node.node_id, "device_id": "cpu"}
        job = ok(create_probe(client, api, body), 201)
        assert job["kind"] == "runtime.health.v1" and job["spec"] == {"device_id": "cpu"}
        claim = ok(claim_runtime_job(client, node))
        assert claim["kind"] == "runtime.health.v1" and claim["spec"] == {"device_id": "cpu"}
        path = f"/api/v1/agent/runtime-probes/{job['id']}/complete"
        # A report of another kind than the job's is refused, and changes nothing.
        refused(client.post(path, json=evidence_report(fence(claim)), headers=node.headers),
                422, "validation_failed")  # fmt: skip
        health = {"process_up": True, "health_ok": True, "model_listed": True,
                  "inference_ok": False}  # fmt: skip
        report = {"kind": "runtime.health.v1", "lease": fence(claim), "device_id": "cpu",
                  "health": health, "loaded_model": "smol"}  # fmt: skip
        assert ok(client.post(path, json=report, headers=node.headers))["state"] == "succeeded"
        view = runtime_job(client, api, job["id"])
        assert view["result"] == {"device_id": "cpu", "health": health, "loaded_model": "smol"}
        listed = ok(client.get(RUNTIME_JOBS, params={"node_id": node.node_id},
                               headers=api.admin_headers))  # fmt: skip
        assert [j["kind"] for j in listed["items"]] == ["runtime.health.v1"]
