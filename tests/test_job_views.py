"""One job view for operators, every kind (schemas/jobs.py: JobView): an artifact job
and a runtime job, side by side through the real API and PostgreSQL, show the same
fields, their lease and their failure in the same shape, and each its own typed spec,
progress and result. A job that ended shows what it ended with, not the last progress
report it was sent, alike in the API and the CLI's table."""

from __future__ import annotations

from typing import Any

import pytest

from schemas.jobs import JobView
from schemas.protocol import ARTIFACT_JOBS, DEPLOYMENT_JOB_PROGRESS, DEPLOYMENT_JOBS
from tests.admin_helpers import ok
from tests.api_server import ApiFactory, RunningApi
from tests.artifact_flows import (
    COMMIT,
    MANIFEST,
    REPOSITORY,
    ROOT,
    claimed,
    complete,
    created,
    fail,
    fence,
    get_job,
    node_with_roots,
)
from tests.artifact_flows import progress as artifact_progress
from tests.cli_support import ok as cli_ok
from tests.deployment_flows import (
    beat,
    claim_deployment_job,
    complete_load,
    create_deployment,
    deployment_body,
    lease_of,
)
from tests.runtime_flows import (
    claim_runtime_job,
    create_probe,
    create_profile,
    environment_id,
    fail_runtime_job,
    probe_body,
    probe_progress,
    ready_node,
    report_runtime,
    runtime_job,
)

pytest_plugins = ["tests.cli_fixtures"]

KIND_PARTS = {"spec", "progress", "result"}


@pytest.fixture
def jobs_api(api_factory: ApiFactory) -> RunningApi:
    return api_factory(job_lease_s=30)


def test_an_artifact_job_and_a_runtime_job_show_lease_and_failure_alike(
    jobs_api: RunningApi,
) -> None:
    api = jobs_api
    with api.client() as client:
        node = ready_node(client, api)
        [acquired] = ok(
            client.get(ARTIFACT_JOBS, params={"state": "succeeded"}, headers=api.admin_headers)
        )["items"]
        # A completed job's result is typed per kind: where the verified files now are.
        assert acquired["result"] == {"root": ROOT, "repository": REPOSITORY, "commit": COMMIT}

        artifact_id = created(client, api, node, max_attempts=1)
        artifact_lease = fence(claimed(client, node))
        body = probe_body(node, create_profile(client, api)["id"], environment_id(client, api))
        probe_id = ok(create_probe(client, api, body), 201)["id"]
        probe_lease = fence(ok(claim_runtime_job(client, node)))
        assert artifact_progress(client, node, artifact_id, artifact_lease, 1000).is_success
        assert probe_progress(client, node, probe_id, probe_lease, "loading").is_success

        artifact, probe = get_job(client, api, artifact_id), runtime_job(client, api, probe_id)
        assert set(artifact) == set(probe) == set(JobView.model_fields) | KIND_PARTS
        assert (artifact["kind"], probe["kind"]) == ("artifact.acquire.v1", "runtime.probe.v1")
        assert set(artifact["lease"]) == set(probe["lease"]) == {"epoch", "expires_at"}
        assert artifact["lease"]["epoch"] == probe["lease"]["epoch"] == 1
        assert artifact["failure"] is None and probe["failure"] is None
        # Progress is the kind's own: bytes for an artifact, a phase for a runtime job.
        assert artifact["progress"]["bytes_done"] == 1000
        assert probe["progress"]["phase"] == "loading" and probe["progress"]["reported_at"]
        assert artifact["result"] is None and probe["result"] is None

        failed = fail(client, node, artifact_id, artifact_lease, "source_unavailable",
                      retryable=False)  # fmt: skip
        assert failed.is_success, failed.text
        failed = fail_runtime_job(client, node, probe_id, probe_lease, "startup_timeout",
                            retryable=False)  # fmt: skip
        assert failed.is_success, failed.text

        artifact, probe = get_job(client, api, artifact_id), runtime_job(client, api, probe_id)
        assert artifact["state"] == probe["state"] == "failed"
        assert artifact["lease"] is None and probe["lease"] is None
        assert artifact["failure"] == {
            "code": "source_unavailable", "retryable": False, "detail": "from a test"
        }  # fmt: skip
        assert probe["failure"] == {
            "code": "startup_timeout", "retryable": False, "detail": "from a test"
        }  # fmt: skip
        assert artifact["result"] is None and probe["result"] is None


def test_a_finished_job_shows_its_result_not_its_last_progress(api: RunningApi, admin: Any) -> None:
    total = sum(entry["size"] for entry in MANIFEST["files"])
    files = len(MANIFEST["files"])
    with api.client() as client:
        node = node_with_roots(client, api, "finished-host")
        job_id = created(client, api, node)
        lease = fence(claimed(client, node))
        # The last report, most of the bytes and no file done yet; then the completion.
        assert artifact_progress(client, node, job_id, lease, 3900).is_success
        running = get_job(client, api, job_id)["progress"]
        assert (running["bytes_done"], running["files_done"]) == (3900, 0)
        answer = complete(client, node, job_id, lease)
        assert answer.status_code == 200 and answer.json()["state"] == "succeeded", answer.text

        done = get_job(client, api, job_id)
        assert done["result"] == {"root": ROOT, "repository": REPOSITORY, "commit": COMMIT}
        progress = done["progress"]
        assert (progress["bytes_done"], progress["bytes_total"]) == (total, total)
        assert (progress["files_done"], progress["files_total"]) == (files, files)
        assert progress["eta_s"] is None

        # A load's last phase was "loading"; once it succeeded its view is its outcome.
        beat(client, node)
        assert report_runtime(client, node).status_code == 200
        profile = create_profile(client, api)
        body = deployment_body(node, profile["id"], environment_id(client, api))
        create_deployment(client, api, body)
        claim = claim_deployment_job(client, node)
        path = DEPLOYMENT_JOB_PROGRESS.format(job_id=claim["job_id"])
        reported = client.post(
            path, json={"lease": lease_of(claim), "phase": "loading"}, headers=node.headers
        )
        assert reported.is_success, reported.text
        load = ok(client.get(f"{DEPLOYMENT_JOBS}/{claim['job_id']}", headers=api.admin_headers))
        assert load["progress"]["phase"] == "loading"
        assert complete_load(client, node, claim).status_code == 200
        load = ok(client.get(f"{DEPLOYMENT_JOBS}/{claim['job_id']}", headers=api.admin_headers))
        assert load["state"] == "succeeded"
        assert load["progress"] is None
        assert load["result"]["health"]["inference_ok"] is True

    # The CLI's table shows the same: all of it, not the last report's 90 %.
    table = cli_ok(admin("jobs", "get", job_id))
    assert f"100% ({files}/{files} files)" in table, table
