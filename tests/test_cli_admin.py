"""`modelforge admin …` as an operator runs it: the real command, a subprocess, against a
real API (and its event pipeline) started by the fixtures. Answers are read back through
the wire models, as a script reading --json would."""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agent.state import Identity, StateDir
from schemas.admin import (
    AuditList,
    DeadLetterList,
    DecommissionPreview,
    DecommissionResult,
    EnrollmentTokenCreated,
    EnrollmentTokenInfo,
    EnrollmentTokenList,
    FleetIncidentList,
    FleetSafety,
    NodeDetail,
    NodeList,
)
from schemas.artifacts import ArtifactJobList, ArtifactJobView, NodeArtifactList
from schemas.deployments import DeploymentList, DeploymentState, DeploymentView
from schemas.events import CloudEvent, EventType
from schemas.jobs import JobKind, JobState
from schemas.runtime import (
    EvidenceList,
    ProbeJobView,
    RuntimeEnvironmentList,
    RuntimeJobList,
    RuntimeProfileList,
    RuntimeProfileView,
    UnloadJobView,
)
from schemas.runtime_local import NodeRuntimeView
from schemas.service_clients import ServiceClientCreated, ServiceClientView
from tests.admin_helpers import beat, credential_id, patch_node, refused
from tests.api_server import OPERATOR_KEY, RunningApi
from tests.artifact_flows import (
    MANIFEST,
    ROOT,
    claimed,
    created,
    fail,
    fence,
    node_with_roots,
    progress,
)
from tests.cli_support import COMMAND_S, ONE_LINE_ERROR, Running, ok
from tests.deployment_flows import claim_deployment_job, complete_load, deployment_body
from tests.flows import INVENTORY, NODES, EnrolledNode, enroll, gpu, inventory_body
from tests.runtime_flows import create_profile, environment_id, probe_body, ready_node

# The `admin` and `background` fixtures: the command run as a subprocess.
pytest_plugins = ["tests.cli_fixtures"]


def test_tokens_create_list_revoke(admin: Any) -> None:
    created = EnrollmentTokenCreated.model_validate_json(
        ok(admin("tokens", "create", "--label", "rack=a1", "--note", "cli", "--json"))
    )
    assert created.token.labels == {"rack": "a1"} and created.secret.startswith("mfe.")
    # Without --json: the table, then the secret alone on the last line of stdout.
    shown = ok(admin("tokens", "create", "--name", "gpu-7"))
    assert "gpu-7" in shown and shown.strip().splitlines()[-1].startswith("mfe.")
    listed = EnrollmentTokenList.model_validate_json(ok(admin("tokens", "list", "--json")))
    assert created.token.id in {t.id for t in listed.items}
    revoked = EnrollmentTokenInfo.model_validate_json(
        ok(admin("tokens", "revoke", str(created.token.id), "--json"))
    )
    assert revoked.state.value == "revoked"
    gone = ok(admin("tokens", "list", "--state", "revoked"))
    assert str(created.token.id)[:8] in gone and "revoked" in gone


def test_nodes_list_get_disable_enable(admin: Any, api: RunningApi) -> None:
    with api.client() as client:
        node = enroll(client, api, "cli-node")
        assert beat(client, node).status_code == 200
        listed = NodeList.model_validate_json(ok(admin("nodes", "list", "--json")))
        assert [str(n.id) for n in listed.items] == [node.node_id]
        detail = NodeDetail.model_validate_json(ok(admin("nodes", "get", node.node_id, "--json")))
        assert detail.hostname == "cli-node" and detail.has_active_credential
        table = ok(admin("nodes", "list"))
        assert "HOSTNAME" in table and "cli-node" in table and node.node_id[:8] in table
        shown = ok(admin("nodes", "get", node.node_id))
        assert "cli-node" in shown and "GPUs" in shown
        ok(admin("nodes", "disable", node.node_id))
        refused(beat(client, node), 403, "node_disabled")
        ok(admin("nodes", "enable", node.node_id))
        assert beat(client, node).status_code == 200
        labelled = NodeDetail.model_validate_json(
            ok(admin("nodes", "label", node.node_id, "zone=b", "--json"))
        )
        assert labelled.labels == {"zone": "b"}


def test_nodes_get_flags_a_gpu_the_last_complete_inventory_lacks(
    admin: Any, api: RunningApi
) -> None:
    with api.client() as client:
        node = enroll(client, api, "cli-gpus")
        first, second = gpu(0), gpu(1)
        for sequence, gpus in ((1, [first, second]), (2, [first])):
            answer = client.put(
                INVENTORY,
                json=inventory_body(node.node_id, sequence, gpus=gpus, hostname="cli-gpus"),
                headers=node.headers,
            )
            assert answer.status_code == 200, answer.text
    # The reconcile consumer records the absence (the workers' side of the inventory).
    api.settle()
    detail = NodeDetail.model_validate_json(ok(admin("nodes", "get", node.node_id, "--json")))
    assert {str(g.uuid): g.missing for g in detail.gpus} == {
        first["uuid"]: False,
        second["uuid"]: True,
    }
    shown = ok(admin("nodes", "get", node.node_id))
    assert "GPUs (1 missing)" in shown and "missing" in shown.split("GPUs (1 missing)")[1]


def agent_state(tmp_path: Path, api: RunningApi, node: EnrolledNode) -> StateDir:
    """The state dir an agent keeps after enrolling this node."""
    state = StateDir(tmp_path / "agent-state")
    state.path.mkdir(mode=0o700)
    state.save_identity(
        Identity(
            node_id=uuid.UUID(node.node_id),
            credential_id=uuid.UUID(credential_id(node.credential)),
            credential=node.credential,
            enrolled_at=datetime.now(UTC),
            api_url=api.base_url,
        )
    )
    return state


def test_rotate_with_state_dir_installs_the_new_credential(
    admin: Any, api: RunningApi, tmp_path: Path
) -> None:
    with api.client() as client:
        node = enroll(client, api, "rotated")
        other = enroll(client, api, "bystander")
        state = agent_state(tmp_path, api, node)
        # A state dir of another node: refused before anything is rotated.
        wrong = admin(
            "nodes", "credential", "rotate", other.node_id, "--state-dir", str(state.path)
        )
        assert wrong.returncode == 1 and "nothing was rotated" in wrong.stderr
        assert beat(client, other).status_code == 200
        result = ok(
            admin("nodes", "credential", "rotate", node.node_id, "--state-dir", str(state.path))
        )
        # The secret went into the state dir, not to the terminal.
        installed = state.load_identity()
        assert installed is not None and installed.credential != node.credential
        assert installed.credential not in result
        refused(beat(client, node), 401, "credential_revoked")
        assert beat(client, EnrolledNode(node.node_id, installed.credential)).status_code == 200
        # Revoke: the installed one is refused too.
        ok(admin("nodes", "credential", "revoke", node.node_id))
        refused(
            beat(client, EnrolledNode(node.node_id, installed.credential)),
            401,
            "credential_revoked",
        )


def test_decommission_preview_then_execute(admin: Any, api: RunningApi) -> None:
    with api.client() as client:
        node = enroll(client, api, "retired")
        preview = DecommissionPreview.model_validate_json(
            ok(admin("nodes", "decommission", node.node_id, "--preview", "--json"))
        )
        assert (
            preview.node_id == uuid.UUID(node.node_id) and len(preview.credentials_to_revoke) == 1
        )
        # Asked, and answered no: nothing happens.
        declined = admin("nodes", "decommission", node.node_id, stdin="n\n")
        assert declined.returncode == 1 and "Credentials To Revoke:" in declined.stdout
        assert beat(client, node).status_code == 200
        done = DecommissionResult.model_validate_json(
            ok(
                admin(
                    "nodes", "decommission", node.node_id, "--yes", "--reason", "retired", "--json"
                )
            )
        )
        assert done.revoked_credential_ids == preview.credentials_to_revoke
        refused(beat(client, node), 401, "node_decommissioned")
        detail = NodeDetail.model_validate_json(ok(admin("nodes", "get", node.node_id, "--json")))
        assert detail.liveness.value == "decommissioned"


def test_decommission_refuses_a_plan_that_changed_after_it_was_shown(
    background: Callable[..., Running], api: RunningApi
) -> None:
    with api.client() as client:
        node = enroll(client, api, "replanned")
        asking = background("nodes", "decommission", node.node_id, stdin=subprocess.PIPE)
        asking.line(lambda line: line.startswith("Plan Hash:"))
        # While the operator reads the plan, the node gets a new credential.
        rotated = client.post(
            f"{NODES}/{node.node_id}/credential/rotate", headers=api.admin_headers
        )
        assert rotated.status_code == 200, rotated.text
        assert asking.process.stdin is not None
        asking.process.stdin.write("y\n")
        asking.process.stdin.close()
        assert asking.process.wait(timeout=COMMAND_S) == 1
        assert asking.process.stderr is not None
        line = asking.process.stderr.read().strip()
        match = ONE_LINE_ERROR.match(line)
        assert match and match["code"] == "decommission_plan_changed", line
        # Nothing was done: the node's new credential still works.
        fresh = EnrolledNode(node.node_id, rotated.json()["credential"])
        assert beat(client, fresh).status_code == 200


def test_jobs_create_list_cancel(admin: Any, api: RunningApi, tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps(MANIFEST))
    with api.client() as client:
        node = node_with_roots(client, api, "jobs-node")
    args = ("--node", node.node_id, "--root", ROOT, "--manifest", str(manifest))
    job = ArtifactJobView.model_validate_json(ok(admin("jobs", "create", *args, "--json")))
    assert job.state is JobState.QUEUED and job.spec.repository == MANIFEST["repository"]
    listed = ArtifactJobList.model_validate_json(
        ok(admin("jobs", "list", "--node", node.node_id, "--json"))
    )
    assert [j.id for j in listed.items] == [job.id]
    # Nothing verified on the node yet, and no runtime worker reported.
    held = NodeArtifactList.model_validate_json(
        ok(admin("nodes", "artifacts", node.node_id, "--json"))
    )
    assert held.items == []
    reported = NodeRuntimeView.model_validate_json(
        ok(admin("nodes", "runtime", node.node_id, "--json"))
    )
    assert not reported.reported
    cancelled = ArtifactJobView.model_validate_json(
        ok(admin("jobs", "cancel", str(job.id), "--json"))
    )
    assert cancelled.state is JobState.CANCELLED
    # Cancelled already: the API's 409, as one line.
    again = admin("jobs", "cancel", str(job.id))
    assert again.returncode == 1 and ONE_LINE_ERROR.match(again.stderr.strip()), again.stderr


def test_refusals_are_one_line_with_code_and_correlation_id(admin: Any) -> None:
    missing = admin("nodes", "get", str(uuid.uuid4()))
    assert missing.returncode == 1 and missing.stdout == ""
    line = missing.stderr.strip()
    assert "\n" not in line and "Traceback" not in missing.stderr
    match = ONE_LINE_ERROR.match(line)
    assert match and match["code"] == "not_found", line
    bad_key = admin("nodes", "list", key="not-the-operator-key")
    match = ONE_LINE_ERROR.match(bad_key.stderr.strip())
    assert bad_key.returncode == 1 and match and match["code"] == "admin_token_invalid"
    assert "not-the-operator-key" not in bad_key.stderr
    # No key anywhere (no environment, no `up`): said, not attempted.
    no_key = admin("nodes", "list", key=None)
    assert no_key.returncode == 1 and "MODELFORGE_OPERATOR_API_KEY" in no_key.stderr
    assert "Traceback" not in no_key.stderr


@pytest.mark.parametrize("option", ["--operator-key", "--api-key", "--key", "--token"])
def test_the_key_is_never_an_argument(admin: Any, option: str) -> None:
    for args in ((option, OPERATOR_KEY, "nodes", "list"), ("nodes", "list", option, OPERATOR_KEY)):
        result = admin(*args, key=None)
        assert result.returncode == 2, result.stderr
        assert "No such option" in result.stderr and "Traceback" not in result.stderr


def test_nodes_watch_prints_an_event_another_action_caused(
    background: Callable[..., Running], api: RunningApi
) -> None:
    with api.client() as client:
        node = enroll(client, api, "watched")
        # Its enrollment's event relayed already: the one event counted is the disable.
        api.settle()
        watch = background("nodes", "watch", "--count", "1", "--json")
        # The first view is drawn once the stream is subscribed: from then on nothing is missed.
        first = NodeList.model_validate_json(watch.line(lambda line: line.startswith('{"items"')))
        assert [str(n.id) for n in first.items] == [node.node_id]
        assert patch_node(client, api, node.node_id, enabled=False).status_code == 200
        event = CloudEvent.model_validate_json(watch.line(lambda line: '"action"' in line))
        assert event.action == EventType.NODE_DISABLED.value and str(event.nodeid) == node.node_id
        assert watch.process.wait(timeout=COMMAND_S) == 0


def test_jobs_watch_follows_a_job_to_its_end(
    background: Callable[..., Running], admin: Any, api: RunningApi
) -> None:
    with api.client() as client:
        node = node_with_roots(client, api, "watched-job")
        job_id = created(client, api, node)
        watch = background("jobs", "watch", job_id, "--json")

        def state(line: str) -> ArtifactJobView:
            return ArtifactJobView.model_validate_json(line)

        assert state(watch.line(lambda line: line.startswith("{"))).state is JobState.QUEUED
        lease = fence(claimed(client, node))
        assert state(watch.line(lambda line: '"leased"' in line)).state is JobState.LEASED
        assert progress(client, node, job_id, lease, 4000).status_code == 200
        seen = state(watch.line(lambda line: '"bytes_done":4000' in line))
        assert seen.progress is not None and seen.progress.bytes_total > 4000
        ok(admin("jobs", "cancel", job_id))
        # A running job's cancel is told to the node; the node then reports it failed.
        failed = fail(client, node, job_id, lease, "cancelled", retryable=False)
        assert failed.status_code == 200, failed.text
        last = state(watch.line(lambda line: '"cancelled"' in line or '"failed"' in line))
        assert last.state in {JobState.CANCELLED, JobState.FAILED}
        assert watch.process.wait(timeout=COMMAND_S) == 1


def test_the_other_areas_answer_through_their_wire_models(admin: Any, api: RunningApi) -> None:
    """Each area's read commands, and a service client's life, over the real API."""
    reads: list[tuple[tuple[str, ...], Any]] = [
        (("runtime", "profiles", "list"), RuntimeProfileList),
        (("runtime", "environments", "list"), RuntimeEnvironmentList),
        (("runtime", "probes", "list"), RuntimeJobList),
        (("runtime", "evidence"), EvidenceList),
        (("deployments", "list"), DeploymentList),
        (("fleet", "status"), FleetSafety),
        (("fleet", "incidents"), FleetIncidentList),
        (("dead-letters", "list"), DeadLetterList),
    ]
    for args, model in reads:
        model.model_validate_json(ok(admin(*args, "--json")))
    client = ServiceClientCreated.model_validate_json(
        ok(admin("service-clients", "create", "chat-app", "--model", "tiny", "--json"))
    )
    assert client.secret.startswith("mfs.")
    revoked = ServiceClientView.model_validate_json(
        ok(admin("service-clients", "revoke", str(client.id), "--json"))
    )
    assert revoked.state.value == "revoked"
    api.settle()
    audit = AuditList.model_validate_json(
        ok(admin("audit", "--target-id", str(client.id), "--json"))
    )
    assert {r.action for r in audit.items} == {
        EventType.SERVICE_CLIENT_CREATED.value,
        EventType.SERVICE_CLIENT_REVOKED.value,
    }
    # The action's family, with the health checks asked for too: the same two rows.
    family = EventType.SERVICE_CLIENT_CREATED.value.split(".")[0]
    by_kind = AuditList.model_validate_json(
        ok(admin("audit", "--kind", family, "--health-checks", "--json"))
    )
    assert {r.target_id for r in by_kind.items} == {str(client.id)}
    assert {r.action.split(".")[0] for r in by_kind.items} == {family}


def test_runtime_bodies_from_stdin(admin: Any, api: RunningApi) -> None:
    """A profile and probes from `-f -` bodies (the README's heredocs), read back."""
    with api.client() as client:
        node = ready_node(client, api, "runtime-node")
        environment = environment_id(client, api)
    envs = RuntimeEnvironmentList.model_validate_json(
        ok(admin("runtime", "environments", "list", "--json"))
    )
    assert str(envs.items[0].id) == environment
    profile_body = {"name": "small", "settings": {"ctx_size": 512, "threads": 2}}
    profile = RuntimeProfileView.model_validate_json(
        ok(
            admin(
                "runtime", "profiles", "create", "-f", "-", "--json", stdin=json.dumps(profile_body)
            )
        )
    )
    assert profile.name == "small" and profile.version == 1
    probe_json = json.dumps(probe_body(node, str(profile.id), environment))
    probe = ProbeJobView.model_validate_json(
        ok(admin("runtime", "probes", "create", "-f", "-", "--json", stdin=probe_json))
    )
    assert probe.kind is JobKind.RUNTIME_PROBE and probe.state is JobState.QUEUED
    unload_json = json.dumps(
        {"kind": JobKind.RUNTIME_UNLOAD.value, "node_id": node.node_id, "device_id": "cpu"}
    )
    unload = UnloadJobView.model_validate_json(
        ok(admin("runtime", "probes", "create", "-f", "-", "--json", stdin=unload_json))
    )
    assert unload.kind is JobKind.RUNTIME_UNLOAD
    got = ProbeJobView.model_validate_json(
        ok(admin("runtime", "probes", "get", str(probe.id), "--json"))
    )
    assert got.id == probe.id
    # Without --json, the labelled keys every `get` prints.
    shown = ok(admin("runtime", "probes", "get", str(probe.id)))
    assert re.search(rf"^ID:\s+{probe.id}\s*$", shown, re.M), shown
    assert re.search(r"^State:\s+queued\s*$", shown, re.M), shown
    # A body the wire model refuses: one line naming the field, before any request.
    wrong = admin("runtime", "profiles", "create", "-f", "-", stdin='{"name": "x", "settings": 1}')
    assert wrong.returncode == 1 and wrong.stderr.startswith("error: -: settings")


def test_deployments_watch_follows_a_model_load(
    background: Callable[..., Running], admin: Any, api: RunningApi
) -> None:
    """Created from a stdin body, watched through pending to ready (the test as the
    node's runtime worker), then drained."""
    with api.client() as client:
        node = ready_node(client, api, "deploy-node")
        profile = create_profile(client, api, name="deployed")
        body = deployment_body(node, profile["id"], environment_id(client, api))
    created = DeploymentView.model_validate_json(
        ok(admin("deployments", "create", "-f", "-", "--json", stdin=json.dumps(body)))
    )
    assert created.state is DeploymentState.PENDING
    watch = background("deployments", "watch", str(created.id), "--until", "ready", "--json")
    first = DeploymentView.model_validate_json(watch.line(lambda line: line.startswith("{")))
    assert first.state is DeploymentState.PENDING
    with api.client() as client:
        claim = claim_deployment_job(client, node)
        assert complete_load(client, node, claim).status_code == 200
    ready = DeploymentView.model_validate_json(watch.line(lambda line: '"ready"' in line))
    assert ready.state is DeploymentState.READY
    assert watch.process.wait(timeout=COMMAND_S) == 0
    drained = DeploymentView.model_validate_json(
        ok(admin("deployments", "drain", str(created.id), "--deadline", "5", "--json"))
    )
    assert drained.state is DeploymentState.DRAINING
