"""One job view for operators, every kind (schemas/jobs.py: JobView): an artifact job
and a runtime job, side by side through the real API and PostgreSQL, show the same
fields, their lease and their failure in the same shape, and each its own typed spec,
progress and result."""

from __future__ import annotations

import pytest

from schemas.jobs import JobView
from schemas.protocol import ARTIFACT_JOBS
from tests.admin_helpers import ok
from tests.api_server import ApiFactory, RunningApi
from tests.artifact_flows import COMMIT, REPOSITORY, ROOT, claimed, created, fail, fence, get_job
from tests.artifact_flows import progress as artifact_progress
from tests.runtime_flows import (
    claim_runtime_job,
    create_probe,
    create_profile,
    environment_id,
    fail_runtime_job,
    probe_body,
    probe_progress,
    ready_node,
    runtime_job,
)

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
