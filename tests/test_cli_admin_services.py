"""`modelforge admin services …` as an operator runs it: the real command, a subprocess,
against a real API whose artifact source is a local Hub-layout server. Answers are read
back through the wire models, as a script reading --json would; refusals are one line
with the API's code; a receipt's hostile text is shown, never obeyed."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from schemas.protocol import SERVICES
from schemas.services import RolloutState, RolloutView, ServiceDetail, ServiceList
from tests.api_server import ApiFactory, RunningApi
from tests.cli_support import Admin, Running, containing, failed, ok
from tests.flows import enroll
from tests.hub_server import HubServer
from tests.runtime_flows import create_profile
from tests.service_api_flows import COMMIT, COMMIT_V2, FILES, REPO, add_replica, db_value

pytest_plugins = ["tests.cli_fixtures"]

# A receipt's message from a hostile or broken writer: an escape sequence and a bidi
# override must reach the terminal as visible text.
HOSTILE = "0 of 3 nodes: 3 insufficient memory \x1b[31mRED\x1b[0m \u202egnp.exe and more words"


@pytest.fixture
def api(api_factory: ApiFactory, hub: HubServer) -> RunningApi:
    hub.state.add(REPO, "main", COMMIT, FILES)
    hub.state.add(REPO, "v2", COMMIT_V2, {**FILES, "model.gguf": FILES["model.gguf"] + b"\0" * 64})
    return api_factory(artifact_source_url=hub.url)


@pytest.fixture
def profile_id(api: RunningApi) -> str:
    with api.client() as client:
        value: str = create_profile(client, api)["id"]
    return value


def create(admin: Admin, profile_id: str, *extra: str) -> ServiceDetail:
    out = ok(
        admin(
            "services", "create", "--name", "chat", "--repository", REPO, "--path",
            "model.gguf", "--profile", profile_id, "--replicas", "2", "--selector",
            "zone=a", "--json", *extra,
        )
    )  # fmt: skip
    return ServiceDetail.model_validate_json(out)


def test_create_list_get_render_and_parse(admin: Admin, api: RunningApi, profile_id: str) -> None:
    service = create(admin, profile_id)
    assert service.name == "chat" and service.replicas == 2
    assert service.template.artifact.commit == COMMIT
    assert service.placement.selector == {"zone": "a"}
    assert service.template.estimate is not None
    assert service.template.estimate.source == "gguf_header"

    listed = ServiceList.model_validate_json(ok(admin("services", "list", "--json")))
    assert [s.id for s in listed.items] == [service.id]
    table = ok(admin("services", "list"))
    [header, row] = table.strip().splitlines()
    assert header.split() == [
        "ID", "NAME", "ENDPOINTS", "STATE", "READY", "GEN", "ROLLOUT", "RECEIPT"
    ]  # fmt: skip
    assert row.split()[:7] == [
        str(service.id)[:8], "chat", "chat,compl", "active", "0/2", "1", "complete"
    ]  # fmt: skip

    with api.client() as client:
        node = enroll(client, api)
    add_replica(api, str(service.id), node.node_id, "gpu0", generation=1, phase="ready")
    _receipt(api, service.id, HOSTILE)

    shown = ok(admin("services", "get", "chat"))
    assert f"{REPO}@{COMMIT}:model.gguf" in shown
    assert "1 ready of 2" in shown
    assert node.node_id[:8] in shown and "gpu0" in shown and "ready" in shown
    # The receipt whole in `get`, cut in the list; its escapes visible, never sent.
    assert "\x1b" not in shown and "\u202e" not in shown
    assert "and more words" in shown and "RED" in shown
    listed_row = ok(admin("services", "list", columns=80)).strip().splitlines()[1]
    assert "\x1b" not in listed_row and "and more words" not in listed_row
    assert "…" in listed_row
    by_id = ServiceDetail.model_validate_json(
        ok(admin("services", "get", str(service.id), "--json"))
    )
    assert [r.device_id for r in by_id.items] == ["gpu0"]
    assert by_id.last_receipt is not None and by_id.last_receipt.message == HOSTILE


def test_scale_rollout_undo_delete(admin: Admin, api: RunningApi, profile_id: str) -> None:
    service = create(admin, profile_id)
    scaled = ServiceDetail.model_validate_json(
        ok(admin("services", "scale", "chat", "3", "--json"))
    )
    assert scaled.replicas == 3
    rolled = ServiceDetail.model_validate_json(
        ok(admin("services", "rollout", "chat", "--revision", "v2", "--json"))
    )
    assert rolled.generation == 2 and rolled.template.artifact.commit == COMMIT_V2
    status = RolloutView.model_validate_json(
        ok(admin("services", "rollout", "status", "chat", "--json"))
    )
    assert status.state is RolloutState.PROGRESSING and status.desired == 3
    assert "progressing" in ok(admin("services", "rollout", "status", str(service.id)))
    undone = ServiceDetail.model_validate_json(
        ok(admin("services", "rollout", "undo", "chat", "--json"))
    )
    assert undone.generation == 3 and undone.template.artifact.commit == COMMIT
    # The same template again: the API's refusal, one line.
    failed(admin("services", "rollout", "chat", "--revision", "main"), "state_conflict")
    deleted = ServiceDetail.model_validate_json(ok(admin("services", "delete", "chat", "--json")))
    assert deleted.state == "deleting"
    failed(admin("services", "scale", str(service.id), "1"), "state_conflict")


def test_a_body_file_and_the_mistakes(
    admin: Admin, api: RunningApi, profile_id: str, tmp_path: Path
) -> None:
    body = {
        "name": "from-file",
        "artifact": {"repository": REPO, "path": "model.gguf"},
        "profile_id": profile_id,
        "replicas": 1,
    }
    path = tmp_path / "service.json"
    path.write_text(json.dumps(body))
    created = ServiceDetail.model_validate_json(
        ok(admin("services", "create", "-f", str(path), "--json"))
    )
    assert created.name == "from-file"
    # A 404 and an unknown name: one line each, exit 1.
    failed(admin("services", "get", str(uuid.uuid4())), "not_found")
    unknown = admin("services", "get", "nobody")
    assert unknown.returncode == 1 and unknown.stdout == ""
    assert unknown.stderr.strip() == "error: no service named 'nobody'"
    # Usage mistakes never reach the API: exit 2, no traceback.
    for args in (
        ("services", "create", "--name", "x"),
        ("services", "rollout", "from-file"),
        ("services", "scale", "from-file", "-1"),
    ):
        result = admin(*args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr
    path.write_text(json.dumps({**body, "replicas": "many"}))
    wrong = admin("services", "create", "-f", str(path))
    assert wrong.returncode == 1 and "replicas" in wrong.stderr and "Traceback" not in wrong.stderr


def test_rollout_status_watch_follows_until_complete(
    admin: Admin, api: RunningApi, profile_id: str, background: Callable[..., Running]
) -> None:
    service = create(admin, profile_id)
    ok(admin("services", "rollout", "chat", "--max-concurrent", "8"))
    watch = background("services", "rollout", "status", "chat", "--watch")
    watch.line(containing("generation 2: progressing"))
    # What the reconciler does when the last replica is replaced, then any event about
    # the service makes the watch read it again.
    db_value(
        api,
        "UPDATE services SET rollout_state = 'complete' WHERE id = $1 RETURNING id",
        service.id,
    )
    with httpx.Client(base_url=api.base_url) as client:
        response = client.post(
            f"{SERVICES}/{service.id}/scale", json={"replicas": 4}, headers=api.admin_headers
        )
        assert response.status_code == 200, response.text
    watch.line(containing("generation 2: complete"))
    assert watch.process.wait(timeout=20) == 0


def _receipt(api: RunningApi, service_id: uuid.UUID, message: str) -> None:
    receipt = {
        "decided_at": "2026-01-01T00:00:00Z",
        "outcome": "unplaceable",
        "nodes_considered": 3,
        "feasible": 0,
        "rejected": {"insufficient_memory": 3},
        "message": message,
    }
    db_value(
        api,
        "UPDATE services SET last_receipt = $1::jsonb WHERE id = $2 RETURNING id",
        json.dumps(receipt),
        service_id,
    )
