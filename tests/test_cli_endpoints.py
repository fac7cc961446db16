"""What a deployment or a service serves (issue 34), through `modelforge admin`: the
`endpoints` of a `-f` body reach the API through the wire model (a wrong one refused
before anything is sent), services take them as flags too; lists show them abbreviated
(`chat,embed`), `-o wide` and a `get` whole, and a deployment's `get` says whether its
loaded chat template calls tools, from the capabilities its node reported at the load.
Real API and PostgreSQL; the test acts as the node."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from schemas.deployments import DeploymentList, DeploymentView
from schemas.protocol import DEPLOYMENT_JOB_COMPLETE
from schemas.services import ServiceDetail, ServiceList
from tests.admin_helpers import ok as answered
from tests.api_server import ApiFactory, RunningApi
from tests.cli_support import Admin, ok
from tests.deployment_flows import HEALTHY, claim_deployment_job, deployment_body, lease_of
from tests.hub_server import HubServer
from tests.runtime_flows import create_profile, environment_id, ready_node
from tests.service_api_flows import COMMIT, FILES, REPO

pytest_plugins = ["tests.cli_fixtures"]

CAPS = {"supports_tools": True, "supports_tool_calls": True, "supports_parallel_tool_calls": False}


@pytest.fixture
def api(api_factory: ApiFactory, hub: HubServer) -> RunningApi:
    hub.state.add(REPO, "main", COMMIT, FILES)
    return api_factory(artifact_source_url=hub.url)


def _key(shown: str, key: str) -> str:
    """A `get`'s value for one labelled key."""
    match = re.search(rf"^{key}:\s+(.*?)\s*$", shown, re.M)
    assert match is not None, f"no {key} in\n{shown}"
    return match.group(1)


def test_deployments_take_and_show_their_endpoints_and_tool_calls(
    admin: Admin, api: RunningApi, tmp_path: Path
) -> None:
    with api.client() as client:
        node = ready_node(client, api, "endpoints-node")
        profile = create_profile(client, api, name="endpoints")
        body = deployment_body(node, profile["id"], environment_id(client, api))

    # A wrong list is the wire model's refusal, one line naming the field; nothing sent.
    path = tmp_path / "deployment.json"
    for wrong in (["images"], ["chat", "chat"], []):
        path.write_text(json.dumps({**body, "endpoints": wrong}))
        refused = admin("deployments", "create", "-f", str(path))
        assert refused.returncode == 1 and refused.stdout == "", refused
        assert refused.stderr.startswith(f"error: {path}: endpoints"), refused.stderr
    listed = DeploymentList.model_validate_json(ok(admin("deployments", "list", "--json")))
    assert listed.items == []

    path.write_text(json.dumps({**body, "endpoints": ["embeddings", "chat"]}))
    created = DeploymentView.model_validate_json(
        ok(admin("deployments", "create", "-f", str(path), "--json"))
    )
    # Kept in the one order the schema gives.
    assert created.endpoints == ["chat", "embeddings"] and created.capabilities is None

    table = ok(admin("deployments", "list")).splitlines()
    assert table[0].split()[:4] == ["ID", "MODEL", "ROLES", "ENDPOINTS"], table
    assert table[1].split()[:4] == [str(created.id)[:8], "smol", "planner", "chat,embed"]
    wide = ok(admin("deployments", "list", "-o", "wide"))
    assert "chat,embeddings" in wide and "TOOL CALLS" in wide and "unknown" in wide
    shown = ok(admin("deployments", "get", str(created.id)))
    assert _key(shown, "Endpoints") == "chat, embeddings"
    assert _key(shown, "Tool Calls") == "unknown"

    # The node loads it and reports what its chat template can do.
    with api.client() as client:
        claim = claim_deployment_job(client, node)
        assert claim["spec"]["endpoints"] == ["chat", "embeddings"]
        done = {"kind": "deployment.load.v1", "lease": lease_of(claim), "device_id": "cpu",
                "health": HEALTHY, "load_s": 0.3, "capabilities": CAPS}  # fmt: skip
        path_done = DEPLOYMENT_JOB_COMPLETE.format(job_id=claim["job_id"])
        answered(client.post(path_done, json=done, headers=node.headers))
    shown = ok(admin("deployments", "get", str(created.id)))
    assert _key(shown, "Tool Calls") == "yes" and _key(shown, "State") == "ready"
    assert "Supports" not in shown, "the caps' keys are read as Tool Calls"
    got = DeploymentView.model_validate_json(
        ok(admin("deployments", "get", str(created.id), "-o", "json"))
    )
    assert got.capabilities is not None and got.capabilities.supports_tool_calls

    # No endpoints in the body: the default two.
    default = DeploymentView.model_validate_json(
        ok(admin("deployments", "create", "-f", "-", "--json",
                 stdin=json.dumps({**body, "model": "other"})))
    )  # fmt: skip
    assert default.endpoints == ["chat", "completions"]
    assert "chat,compl " in ok(admin("deployments", "list"))


def test_services_take_endpoints_as_flags_or_a_body_and_show_them(
    admin: Admin, api: RunningApi, tmp_path: Path
) -> None:
    with api.client() as client:
        profile = create_profile(client, api)["id"]
    common = ("--repository", REPO, "--path", "model.gguf", "--profile", profile)
    made = ServiceDetail.model_validate_json(
        ok(admin("services", "create", "--name", "embedder", *common,
                 "--endpoint", "embeddings", "--endpoint", "chat", "--json"))
    )  # fmt: skip
    assert made.template.endpoints == ["chat", "embeddings"]
    # A usage mistake: exit 2 before anything is sent.
    for wrong in (("--endpoint", "images"), ("--endpoint", "chat", "--endpoint", "chat")):
        result = admin("services", "create", "--name", "wrong", *common, *wrong)
        assert result.returncode == 2 and "--endpoint" in result.stderr, result
        assert "Traceback" not in result.stderr
    body = {"name": "from-file", "artifact": {"repository": REPO, "path": "model.gguf"},
            "profile_id": profile, "replicas": 0, "endpoints": ["completions"]}  # fmt: skip
    path = tmp_path / "service.json"
    path.write_text(json.dumps(body))
    from_file = ServiceDetail.model_validate_json(
        ok(admin("services", "create", "-f", str(path), "--json"))
    )
    assert from_file.template.endpoints == ["completions"]
    listed = ServiceList.model_validate_json(ok(admin("services", "list", "--json")))
    assert {s.name for s in listed.items} == {"embedder", "from-file"}

    table = ok(admin("services", "list")).splitlines()
    assert table[0].split()[:3] == ["ID", "NAME", "ENDPOINTS"], table
    rows = {line.split()[1]: line.split()[2] for line in table[1:]}
    assert rows == {"embedder": "chat,embed", "from-file": "compl"}, table
    wide = ok(admin("services", "list", "-o", "wide"))
    assert "chat,embeddings" in wide and "completions" in wide
    # 80 columns hold them beside short names (tests/test_cli_layout.py: long ones).
    narrow = ok(admin("services", "list", columns=80)).splitlines()
    assert len(narrow) == 3 and all(len(line) <= 80 for line in narrow), narrow
    assert "chat,embed" in "\n".join(narrow)
    assert _key(ok(admin("services", "get", "embedder")), "Endpoints") == "chat, embeddings"

    # A rollout changes them (a new generation); the flag alone is enough.
    rolled = ServiceDetail.model_validate_json(
        ok(admin("services", "rollout", "embedder", "--endpoint", "embeddings", "--json"))
    )
    assert rolled.generation == 2 and rolled.template.endpoints == ["embeddings"]
    assert _key(ok(admin("services", "get", "embedder")), "Endpoints") == "embeddings"
