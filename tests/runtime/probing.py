"""Runtime jobs end to end: a node whose agent acquired the model through an artifact
job from a local Hub-layout server, the runtime worker beside it (the node's credential
from the agent's state dir), and runtime jobs run to their end through the real API.
Shared by the end-to-end runtime tests; its fixtures are in tests/runtime/conftest.py."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from schemas.protocol import GATEWAY_PREFIX, NODES, RUNTIME_ENVIRONMENTS, RUNTIME_JOBS
from tests.agent.artifact_agent import StartAgent, created, ended, start_agent
from tests.agent.harness import admin, wait_until
from tests.api_server import ApiFactory, RunningApi
from tests.deployment_flows import create_deployment, service_client, wait_for_deployment
from tests.hub_server import HubServer
from tests.runtime.harness import RuntimeProcess
from tests.runtime_flows import create_profile

REPO = "acme/smollm2"
COMMIT = "5e15d1f0a0b4c3d2e1f00112233445566778899a"
GGUF = "smollm2.Q4_1.gguf"
StartRuntime = Callable[..., RuntimeProcess]
MESSAGES: list[Any] = [{"role": "user", "content": "Say hello."}]


@pytest.fixture
def probe_api(api_factory: ApiFactory) -> RunningApi:
    return api_factory(job_lease_s=10, job_retry_base_s=0.2)


def node_with_model(
    api: RunningApi, agents: StartAgent, hub: HubServer, tmp_path: Path, model: Path
) -> tuple[str, Path, Path]:
    """An agent that acquired the model through an artifact job: (node id, file, state)."""
    data = model.read_bytes()
    hub.state.add(REPO, "main", COMMIT, {GGUF: data})
    _, node_id, root = start_agent(api, agents, hub, tmp_path)
    digest = {"algorithm": "sha256", "value": hashlib.sha256(data).hexdigest()}
    manifest = {"repository": REPO, "commit": COMMIT,
                "files": [{"path": GGUF, "size": len(data), "digest": digest}]}  # fmt: skip
    job = created(api, {"node_id": node_id, "target_root": str(root), "manifest": manifest})
    assert ended(api, job["id"], 60)["state"] == "succeeded"
    return node_id, root / REPO / COMMIT / GGUF, tmp_path / "state"


def runtime_beside(
    runtimes: StartRuntime,
    api: RunningApi,
    state: Path,
    binary: Path,
    roots: list[Path],
    name: str = "runtime",
    **extra: Any,
) -> RuntimeProcess:
    """A runtime worker beside the agent whose state dir is `state` and whose artifact
    roots are `roots` (`name`: its directory, for several on one test)."""
    settings: dict[str, Any] = {
        "api_url": api.base_url,
        "state_dir": str(state),
        "artifact_roots": [str(root) for root in roots],
        "llama_server_path": str(binary),
        "report_interval_s": 0.5,
        # Longer than any test here: every job is claimed because a notification (the
        # agent's SSE listener, relayed by the API from NATS) woke the worker.
        "job_poll_interval_s": 600,
        "llama_server_probe_interval_s": 0.05,
        "trust_env": False,
    }
    return runtimes(name, **{**settings, **extra})


@dataclass
class ProbeNode:
    """A node whose agent acquired the model through an artifact job, and the runtime
    worker to start beside it."""

    api: RunningApi
    node_id: str
    model_file: Path
    state: Path
    binary: Path
    runtimes: StartRuntime

    def runtime(self, binary: Path | None = None, **extra: Any) -> tuple[RuntimeProcess, str]:
        """A runtime worker beside the agent, and the environment it reported."""
        binary = binary or self.binary
        roots = [self.model_file.parents[len(Path(REPO).parts) + 1]]
        runtime = runtime_beside(self.runtimes, self.api, self.state, binary, roots, **extra)
        return runtime, reported_environment(self.api, self.node_id, binary)


@pytest.fixture
def probe_node(
    probe_api: RunningApi,
    agents: StartAgent,
    runtimes: StartRuntime,
    hub: HubServer,
    tmp_path: Path,
    llama_server: Path,
    instruct_model: Path,
) -> ProbeNode:
    node_id, model_file, state = node_with_model(probe_api, agents, hub, tmp_path, instruct_model)
    return ProbeNode(probe_api, node_id, model_file, state, llama_server, runtimes)


def reported_environment(api: RunningApi, node_id: str, binary: Path) -> str:
    digest = hashlib.sha256(binary.read_bytes()).hexdigest()

    def found() -> str | None:
        runtime = admin(api, "GET", f"{NODES}/{node_id}/runtime")
        if not runtime["reported"]:
            return None
        items = admin(api, "GET", RUNTIME_ENVIRONMENTS)["items"]
        return next((e["id"] for e in items if e["binary_sha256"] == digest), None)

    return wait_until(found, 30, "the runtime worker's report of its binary")


def probe(api: RunningApi, node_id: str, profile_id: str, environment_id: str) -> dict[str, Any]:
    return run_job(api, {
        "node_id": node_id,
        "artifact": {"repository": REPO, "commit": COMMIT, "path": GGUF},
        "profile_id": profile_id,
        "environment_id": environment_id,
        "max_attempts": 1,
    })  # fmt: skip


def device_job(api: RunningApi, node_id: str, kind: str) -> dict[str, Any]:
    return run_job(api, {"kind": kind, "node_id": node_id, "device_id": "cpu", "max_attempts": 1})


def run_job(api: RunningApi, body: dict[str, Any]) -> dict[str, Any]:
    """Create the runtime job; the job once it ended."""
    with api.client() as client:
        response = client.post(RUNTIME_JOBS, json=body, headers=api.admin_headers)
    assert response.status_code == 201, response.text
    return ended(api, response.json()["id"], 90, collection=RUNTIME_JOBS)


def deploy_model(
    api: RunningApi,
    node_id: str,
    environment_id: str,
    profile_id: str,
    model: str = "smol",
    **extra: Any,
) -> dict[str, Any]:
    """A deployment of the node's model (REPO at COMMIT, its GGUF) on its CPU for the role
    `planner`, once ready."""
    body = {
        "node_id": node_id,
        "device_id": "cpu",
        "artifact": {"repository": REPO, "commit": COMMIT, "path": GGUF},
        "profile_id": profile_id,
        "environment_id": environment_id,
        "model": model,
        "roles": ["planner"],
        **extra,
    }
    with api.client() as client:
        created = create_deployment(client, api, body)
    return wait_for_deployment(api, created["id"], "ready", 90)


def deployed(node: ProbeNode, environment: str, **extra: Any) -> dict[str, Any]:
    """A deployment of the node's model, once ready."""
    with node.api.client() as client:
        profile = create_profile(client, node.api, "deploy-small", ctx_size=512, threads=2)
    return deploy_model(node.api, node.node_id, environment, profile["id"], **extra)


def gateway(api: RunningApi, **scope: Any) -> tuple[openai.OpenAI, str]:
    """The official client of the API's gateway, as a new service client (its scope
    `scope`, deployment_flows.py's defaults otherwise), and that client's secret."""
    with api.client() as client:
        secret = service_client(client, api, **scope)
    base = api.base_url + GATEWAY_PREFIX
    return openai.OpenAI(base_url=base, api_key=secret, max_retries=0, timeout=60), secret


def gateway_client(node: ProbeNode) -> openai.OpenAI:
    return gateway(node.api)[0]
