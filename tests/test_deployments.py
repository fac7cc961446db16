"""The deployment lifecycle against the real API and PostgreSQL, the test speaking for the
runtime worker over the protocol, and the reconciler (workers/deployments.py) as the
workers run it: every transition audited; a failed load retried with the job's backoff,
then `failed` with the typed runtime error; drain and unload; a node that goes offline
makes its deployments unavailable, and they come back when it returns and reports them
loaded; a runtime worker that lost its deployment gets it loaded again; no reload while
the partition breaker holds."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from schemas.protocol import DEPLOYMENTS
from store.deployments.reconcile import REPORT_MARGIN
from store.deployments.rules import ReconcilePolicy
from tests.agent.harness import wait_until
from tests.api_server import ApiFactory, RunningApi
from tests.deployment_flows import (
    HEALTHY,
    RECONCILE_POLICY,
    DeployedNode,
    beat,
    claim_deployment_job,
    complete_load,
    complete_target,
    create_deployment,
    deployment,
    deployment_body,
    fail_deployment_job,
    ready_deployment,
    state_after_sweeps,
    transitions,
    until_state,
)
from tests.flows import THRESHOLDS
from tests.runtime_flows import create_profile, environment_id, ready_node
from workers.deployments import reconcile


@pytest.fixture
def lifecycle_api(api_factory: ApiFactory) -> RunningApi:
    return api_factory(
        stale_after_s=THRESHOLDS.stale_after_s,
        offline_after_s=THRESHOLDS.offline_after_s,
        job_retry_base_s=0.1,
    )


def test_load_ready_drain_unloaded_each_step_audited(lifecycle_api: RunningApi) -> None:
    api = lifecycle_api
    with api.client() as client:
        deployed = ready_deployment(client, api)
        deployment_id = deployed.deployment["id"]
        drained = client.post(
            f"{DEPLOYMENTS}/{deployment_id}/drain",
            json={"deadline_s": 5},
            headers=api.admin_headers,
        )
        assert drained.status_code == 200 and drained.json()["state"] == "draining"
        claim = claim_deployment_job(client, deployed.node)
        assert claim["kind"] == "deployment.drain.v1" and claim["spec"]["deadline_s"] == 5
        # A completion of another kind than the job's is refused and changes nothing.
        other = complete_target(client, deployed.node, {**claim, "kind": "deployment.unload.v1"},
                                unloaded=True)  # fmt: skip
        assert other.status_code == 422 and other.json()["code"] == "validation_failed"
        assert deployment(client, api, deployment_id)["state"] == "draining"
        done = complete_target(client, deployed.node, claim, finished=1, cut=0, settle_s=0.1)
        assert done.status_code == 200, done.text
        assert deployment(client, api, deployment_id)["state"] == "unloaded"
        again = client.post(f"{DEPLOYMENTS}/{deployment_id}/unload", headers=api.admin_headers)
        assert again.status_code == 409 and again.json()["code"] == "state_conflict"
        jobs = client.get(f"{DEPLOYMENTS}/{deployment_id}/jobs", headers=api.admin_headers)
        kinds = [job["kind"] for job in jobs.json()["items"]]
    assert kinds == ["deployment.drain.v1", "deployment.load.v1"]
    assert jobs.json()["items"][0]["result"] == {"finished": 1, "cut": 0, "settle_s": 0.1}
    assert transitions(api, deployment_id) == [
        ("pending", "loading"),
        ("loading", "ready"),
        ("ready", "draining"),
        ("draining", "unloaded"),
    ]


def test_a_failed_load_retries_then_fails_with_the_runtime_error(
    lifecycle_api: RunningApi,
) -> None:
    api = lifecycle_api
    with api.client() as client:
        node = ready_node(client, api)
        profile = create_profile(client, api)
        body = deployment_body(node, profile["id"], environment_id(client, api), max_attempts=2)
        created = create_deployment(client, api, body)
        first = claim_deployment_job(client, node)
        answer = fail_deployment_job(client, node, first, "startup_timeout", retryable=True)
        assert answer.json()["state"] == "queued"
        assert deployment(client, api, created["id"])["state"] == "pending"

        def claimed_again() -> dict[str, Any] | None:
            response = client.get("/api/v1/agent/deployment-jobs/next", headers=node.headers)
            return response.json() if response.status_code == 200 else None

        second = wait_until(claimed_again, 10, "the retry after its backoff")
        assert second["attempt"] == 2 and second["job_id"] == first["job_id"]
        # A report under the first attempt's lease is refused (fenced).
        stale = complete_load(client, node, first)
        assert stale.status_code == 409 and stale.json()["code"] == "lease_stale"
        fail_deployment_job(client, node, second, "out_of_memory", retryable=False)
        view = deployment(client, api, created["id"])
    assert view["state"] == "failed"
    assert view["failure"]["code"] == "out_of_memory"
    assert transitions(api, created["id"])[-1] == ("loading", "failed")


async def test_offline_makes_it_unavailable_and_a_return_with_it_loaded_makes_it_ready(
    lifecycle_api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> None:
    api = lifecycle_api
    with api.client() as client:
        deployed = ready_deployment(client, api)
    deployment_id = deployed.deployment["id"]
    # Silent past the offline threshold: unavailable (routing stops at once).
    await until_state(lambda: state_after_sweeps(sessions, api, deployment_id), "unavailable")
    with api.client() as client:
        view = deployment(client, api, deployment_id)
        assert view["failure"]["code"] == "node_offline"

    async def returned() -> str:
        # It is back (beating) and its runtime worker still has the deployment loaded.
        with api.client() as client:
            beat(client, deployed.node)
            deployed.report(client, loaded=True)
        return await state_after_sweeps(sessions, api, deployment_id)

    await until_state(returned, "ready")
    assert ("ready", "unavailable") in transitions(api, deployment_id)


async def test_a_runtime_worker_that_lost_the_deployment_gets_it_loaded_again(
    lifecycle_api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> None:
    api = lifecycle_api
    with api.client() as client:
        deployed: DeployedNode = ready_deployment(client, api)
        beat(client, deployed.node)
    deployment_id = deployed.deployment["id"]
    # Time passing past a threshold (part of the scenario, not a wait for a condition):
    # a report's silence counts only past the margin after the last transition.
    await asyncio.sleep(REPORT_MARGIN.total_seconds() + 0.1)
    with api.client() as client:
        beat(client, deployed.node)
        deployed.report(client, loaded=False)  # the runtime worker restarted: nothing loaded
    done = await reconcile(sessions, RECONCILE_POLICY)
    assert done.get("reload queued") == 1
    with api.client() as client:
        assert deployment(client, api, deployment_id)["state"] == "pending"
        claim = claim_deployment_job(client, deployed.node)
        assert claim["kind"] == "deployment.load.v1"
        assert complete_load(client, deployed.node, claim).status_code == 200
        assert deployment(client, api, deployment_id)["state"] == "ready"


async def test_a_failed_health_check_makes_it_unavailable_until_a_check_passes(
    api_factory: ApiFactory, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """deployment.health.v1 on the control plane: due after the health period, claimed
    and answered by the node; a failed check makes a loaded deployment unavailable (its
    node reporting it loaded does not bring it back), and a passing one makes it ready."""
    period = 0.3
    api = api_factory(deployment_health_period_s=period)
    policy = ReconcilePolicy(health_period_s=period)
    with api.client() as client:
        deployed = ready_deployment(client, api)
    deployment_id = deployed.deployment["id"]

    async def reconciled(expected: str) -> None:
        """Reconcile (the node beating and reporting it loaded) until a pass did `expected`."""

        async def once() -> str:
            with api.client() as client:
                beat(client, deployed.node)
                deployed.report(client, loaded=True)
            done = await reconcile(sessions, policy)
            return expected if done.get(expected) else ",".join(done) or "nothing"

        await until_state(once, expected)

    def check(healthy: bool) -> dict[str, Any]:
        with api.client() as client:
            claim = claim_deployment_job(client, deployed.node)
            assert claim["kind"] == "deployment.health.v1"
            health = {**HEALTHY, "inference_ok": healthy}
            done = complete_target(client, deployed.node, claim, health=health, in_flight=0)
            assert done.status_code == 200, done.text
            return deployment(client, api, deployment_id)

    await reconciled("health queued")
    failed = check(healthy=False)
    assert failed["state"] == "unavailable" and failed["failure"]["code"] == "health_failed"
    # Reported loaded, it stays unavailable; its next check comes when due.
    await reconciled("health queued")
    with api.client() as client:
        assert deployment(client, api, deployment_id)["state"] == "unavailable"
    assert check(healthy=True)["state"] == "ready"
    assert transitions(api, deployment_id)[-2:] == [
        ("ready", "unavailable"),
        ("unavailable", "ready"),
    ]
