"""`modelforge admin` on what the gateway serves, over the real API: a service client
read and rotated (the old secret refused by the gateway at once), a deployment unloaded
and its lifecycle jobs listed (the test as the node's runtime worker), a runtime
profile read back. Every refusal is the CLI's one line."""

from __future__ import annotations

import re
import uuid

from rich.cells import cell_len

from schemas.deployments import DeploymentJobList, DeploymentState, DeploymentView
from schemas.jobs import JobKind, JobState
from schemas.protocol import GATEWAY_MODELS
from schemas.runtime import RuntimeProfileView
from schemas.service_clients import ServiceClientCreated, ServiceClientState, ServiceClientView
from tests.api_server import RunningApi
from tests.cli_support import Admin, failed, ok
from tests.deployment_flows import (
    claim_deployment_job,
    complete_target,
    deployment,
    ready_deployment,
)
from tests.runtime_flows import create_profile

SGR = re.compile(r"\x1b\[[0-9;]*m")

pytest_plugins = ["tests.cli_fixtures"]


def models(api: RunningApi, secret: str) -> str | None:
    """What the gateway answers a caller presenting this secret: None when it serves
    it, else the code of its 401 (the OpenAI error shape)."""
    with api.client() as client:
        response = client.get(GATEWAY_MODELS, headers={"Authorization": f"Bearer {secret}"})
    if response.status_code == 200:
        return None
    assert response.status_code == 401, response.text
    code: str = response.json()["error"]["code"]
    return code


def test_service_clients_get_and_rotate(admin: Admin, api: RunningApi) -> None:
    created = ServiceClientCreated.model_validate_json(
        ok(admin("service-clients", "create", "chat-app", "--model", "smol", "--json"))
    )
    client_id = str(created.id)
    got = ServiceClientView.model_validate_json(
        ok(admin("service-clients", "get", client_id, "--json"))
    )
    # The same client, and never its secret again.
    assert got == ServiceClientView.model_validate(created.model_dump(exclude={"secret"}))
    shown = ok(admin("service-clients", "get", client_id))
    assert "chat-app" in shown and client_id[:8] in shown and created.secret not in shown
    assert models(api, created.secret) is None

    rotated = ServiceClientCreated.model_validate_json(
        ok(admin("service-clients", "rotate", client_id, "--json"))
    )
    assert rotated.id == created.id and rotated.state is ServiceClientState.ACTIVE
    assert rotated.secret.startswith("mfs.") and rotated.secret != created.secret
    assert rotated.rotated_at is not None
    # The gateway retires the old secret at once.
    assert models(api, rotated.secret) is None
    assert models(api, created.secret) == "credential_invalid"
    # Without --json: the table, then the new secret alone on the last line of stdout.
    table = admin("service-clients", "rotate", client_id)
    third = ok(table).strip().splitlines()[-1]
    assert third.startswith("mfs.") and third != rotated.secret and "shown once" in table.stderr
    assert models(api, third) is None and models(api, rotated.secret) == "credential_invalid"
    after = ServiceClientView.model_validate_json(
        ok(admin("service-clients", "get", client_id, "--json"))
    )
    assert after.rotated_at is not None and after.rotated_at >= rotated.rotated_at

    # A revoked client is never given a new secret; an unknown one is not found.
    ok(admin("service-clients", "revoke", client_id))
    failed(admin("service-clients", "rotate", client_id), "state_conflict")
    assert models(api, third) == "credential_revoked"
    failed(admin("service-clients", "get", str(uuid.uuid4())), "not_found")
    failed(admin("service-clients", "rotate", str(uuid.uuid4())), "not_found")
    malformed = admin("service-clients", "get", "chat-app")
    assert malformed.returncode == 2 and "Traceback" not in malformed.stderr


def test_deployments_unload_and_jobs(admin: Admin, api: RunningApi) -> None:
    with api.client() as client:
        deployed = ready_deployment(client, api, "unloaded-node")
    deployment_id = deployed.deployment["id"]
    jobs = DeploymentJobList.model_validate_json(
        ok(admin("deployments", "jobs", deployment_id, "--json"))
    )
    assert [(j.kind, j.state) for j in jobs.items] == [
        (JobKind.DEPLOYMENT_LOAD, JobState.SUCCEEDED)
    ]

    # Unload: from ready, with no time for invokes in flight.
    unloading = DeploymentView.model_validate_json(
        ok(admin("deployments", "unload", deployment_id, "--json"))
    )
    assert str(unloading.id) == deployment_id and unloading.state is DeploymentState.DRAINING
    jobs = DeploymentJobList.model_validate_json(
        ok(admin("deployments", "jobs", deployment_id, "--json"))
    )
    # Newest first: the unload job it queued (deadline 0), then the load.
    unload, load = jobs.items
    assert unload.kind is JobKind.DEPLOYMENT_UNLOAD and unload.state is JobState.QUEUED
    assert unload.spec.model_dump()["deadline_s"] == 0
    assert load.kind is JobKind.DEPLOYMENT_LOAD
    table = ok(admin("deployments", "jobs", deployment_id))
    assert str(unload.id)[:8] in table and JobKind.DEPLOYMENT_UNLOAD.value in table
    assert "queued" in table and "succeeded" in table

    # The node's runtime worker carries it out: the deployment is unloaded.
    with api.client() as client:
        claim = claim_deployment_job(client, deployed.node)
        assert claim["kind"] == JobKind.DEPLOYMENT_UNLOAD.value, claim
        done = complete_target(client, deployed.node, claim, unloaded=True, cut=0)
        assert done.status_code == 200, done.text
        assert deployment(client, api, deployment_id)["state"] == "unloaded"
    # Ended already: the API's 409 as one line; an unknown deployment, its 404.
    failed(admin("deployments", "unload", deployment_id), "state_conflict")
    failed(admin("deployments", "unload", str(uuid.uuid4())), "not_found")
    failed(admin("deployments", "jobs", str(uuid.uuid4())), "not_found")


def test_runtime_profiles_get(admin: Admin, tty_admin: Admin, api: RunningApi) -> None:
    with api.client() as client:
        profile = create_profile(client, api, name="tuned", batch_size=64)
    view = RuntimeProfileView.model_validate_json(
        ok(admin("runtime", "profiles", "get", profile["id"], "--json"))
    )
    assert view == RuntimeProfileView.model_validate(profile)
    assert (view.settings["ctx_size"], view.settings["batch_size"]) == (512, 64)
    shown = ok(admin("runtime", "profiles", "get", profile["id"]))
    assert "tuned" in shown and profile["id"] in shown
    # The settings it sets, as key=value, never a dozen nulls.
    assert "batch_size=64" in shown and "ctx_size=512" in shown and "None" not in shown
    narrow = SGR.sub("", ok(tty_admin("runtime", "profiles", "get", profile["id"], columns=80)))
    assert all(cell_len(line) <= 80 for line in narrow.splitlines()), narrow
    assert "batch_size=64" in narrow
    failed(admin("runtime", "profiles", "get", str(uuid.uuid4())), "not_found")
