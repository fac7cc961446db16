"""A small real fleet for the model services' end-to-end tests (issue 32), every part a
real process or server:

* a `modelforge worker` process (the service reconciler, the deployment reconciler, the
  liveness sweep, lease expiry and the event pipeline run there, as in production), on
  the test's PostgreSQL and a private NATS;
* the API in-process on loopback (tests/api_server.py), resolving a service's artifact
  from a local Hub-layout server (tests/hub_server.py) that serves the SmolLM2 GGUF;
* nodes, each an enrolled agent offering an artifact root (it acquires the model from
  the same local Hub when the reconciler sends it an artifact job) and a runtime worker
  beside it with the real llama-server, on the node's CPU device.

Liveness runs on short thresholds (stale 2 s, offline 4 s, heartbeats every 0.5 s), so a
killed node is offline within seconds. The partition breaker is kept out of the way
(tests/worker_processes.py): one node of three killed on purpose is a third of the
fleet, which it would rightly hold as a partition."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from schemas.protocol import ARTIFACT_JOBS, DEPLOYMENTS, RUNTIME_PROFILES, SERVICES
from stack.embedded_nats import EmbeddedNats
from tests.admin_helpers import ok
from tests.agent.artifact_agent import StartAgent, start_agent
from tests.agent.harness import AgentProcess, admin, wait_until
from tests.api_server import ApiFactory, RunningApi
from tests.deployment_flows import service_client
from tests.hub_server import HubServer
from tests.runtime.harness import RuntimeProcess
from tests.runtime.probing import StartRuntime, reported_environment, runtime_beside
from tests.worker_processes import OFFLINE_S, STALE_S, Workers

# The model as the Hub serves it; a service names it by repository, revision and path,
# and the control plane resolves the revision to this commit.
REPOSITORY = "acme/smollm2"
REVISION = "main"
COMMIT = "5e15d1f0a0b4c3d2e1f00112233445566778899a"
GGUF = "smollm2.Q4_1.gguf"
ARTIFACT = {"repository": REPOSITORY, "revision": REVISION, "path": GGUF}

# The periodic work of the worker process, faster than production's so that each step of
# a test (a replica placed, a drain issued, a lost node replaced) takes a second or two
# rather than a production period. Names the service reconciler does not read are
# ignored (WorkerSettings takes extra variables).
WORKER_ENV = {
    "MODELFORGE_DEPLOYMENT_SWEEP_PERIOD_S": "0.5",
    "MODELFORGE_SERVICE_SWEEP_PERIOD_S": "0.5",
    "MODELFORGE_LEASE_SWEEP_PERIOD_S": "0.5",
    "MODELFORGE_JOB_LEASE_S": "10",
    "MODELFORGE_JOB_RETRY_BASE_S": "0.2",
    # A replica whose node is lost is replaced after this grace (production: longer, so a
    # node restarting in place is not replaced at once).
    "MODELFORGE_SERVICE_HEAL_GRACE_S": "1",
    # A node where a replica failed is avoided this long, doubling (production: 10 s).
    "MODELFORGE_SERVICE_BACKOFF_BASE_S": "1",
}


@dataclass
class Node:
    """An agent and the runtime worker beside it: one node with one CPU device."""

    name: str
    node_id: str
    agent: AgentProcess
    runtime: RuntimeProcess
    agent_config: Path

    def kill(self) -> None:
        """SIGKILL both processes, as a machine that loses power: the runtime worker's
        llama-servers die with it (a parent-death signal; their process groups are
        killed too, in case)."""
        servers = [self.runtime.server_pid(device) for device in ("cpu",)]
        self.runtime.kill()
        self.agent.kill()
        for pid in servers:
            if pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)


@dataclass
class ServiceFleet:
    api: RunningApi
    hub: HubServer
    workers: Workers
    home: Path
    binary: Path
    agents: StartAgent
    runtimes: StartRuntime
    nodes: dict[str, Node] = field(default_factory=dict)

    # Nodes ---------------------------------------------------------------------------------

    def start_nodes(self, *names: str) -> list[Node]:
        """Start the named nodes side by side (each: enrolled, its root offered, its runtime
        worker's environment reported)."""
        with ThreadPoolExecutor(len(names)) as pool:
            return list(pool.map(self.start_node, names))

    def start_node(self, name: str) -> Node:
        home = self.home / name
        home.mkdir()
        agent, node_id, root = start_agent(
            self.api, self.agents, self.hub, home, hostname=f"node-{name}"
        )
        runtime = runtime_beside(
            self.runtimes, self.api, home / "state", self.binary, [root], f"rt-{name}"
        )
        reported_environment(self.api, node_id, self.binary)
        node = Node(name, node_id, agent, runtime, home / "agent.yaml")
        self.nodes[name] = node
        return node

    def restart(self, node: Node) -> None:
        """The node back after a kill: its agent on the same state dir (the same node),
        a fresh runtime worker beside it (nothing loaded: its llama-server died)."""
        node.agent = self.agents(node.agent_config, node.agent_config.with_name("agent-2.log"))
        node.runtime.start()

    def by_id(self, node_id: str) -> Node:
        return next(n for n in self.nodes.values() if n.node_id == node_id)

    # The operator's side -------------------------------------------------------------------

    def profile(self, name: str, **settings: Any) -> str:
        """A runtime profile for two shared cores: one thread, one slot, a small context."""
        body = {
            "name": name,
            "settings": {"threads": 1, "server_args": {"parallel": 1}, **settings},
        }
        return str(self.post(RUNTIME_PROFILES, body, 201)["id"])

    def client_secret(self, model: str) -> str:
        with self.api.client() as client:
            return service_client(client, self.api, name=f"load-{model}", models=[model], roles=[])

    def post(self, path: str, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
        with self.api.client() as client:
            answer: dict[str, Any] = ok(
                client.post(path, json=body, headers=self.api.admin_headers), status
            )
        return answer

    def create_service(self, name: str, profile_id: str, **body: Any) -> dict[str, Any]:
        payload = {"name": name, "artifact": ARTIFACT, "profile_id": profile_id, **body}
        return self.post(SERVICES, payload, 201)

    def service(self, service_id: str) -> dict[str, Any]:
        return admin(self.api, "GET", f"{SERVICES}/{service_id}")

    def scale(self, service_id: str, replicas: int) -> dict[str, Any]:
        return self.post(f"{SERVICES}/{service_id}/scale", {"replicas": replicas})

    def rollout(self, service_id: str, **body: Any) -> dict[str, Any]:
        return self.post(f"{SERVICES}/{service_id}/rollout", body)

    def until_service(
        self,
        service_id: str,
        check: Callable[[dict[str, Any]], bool],
        timeout_s: float,
        what: str,
    ) -> dict[str, Any]:
        """The service's detail once `check` holds, polled until a deadline (the message
        names the last detail seen)."""
        last: dict[str, Any] = {}

        def reached() -> dict[str, Any] | None:
            nonlocal last
            last = self.service(service_id)
            return last if check(last) else None

        try:
            return wait_until(reached, timeout_s, what)
        except AssertionError as late:
            raise AssertionError(f"{late}\nthe service: {last}\n{self.logs()}") from None

    def until_ready(self, service_id: str, replicas: int, timeout_s: float) -> dict[str, Any]:
        """Exactly `replicas` live replicas, every one ready, none left draining."""
        return self.until_service(
            service_id,
            lambda s: (
                len(s["items"]) == replicas and all(r["phase"] == "ready" for r in s["items"])
            ),
            timeout_s,
            f"{replicas} ready replicas and no other",
        )

    def deployment_jobs(self, deployment_id: str) -> list[dict[str, Any]]:
        jobs = admin(self.api, "GET", f"{DEPLOYMENTS}/{deployment_id}/jobs")
        items: list[dict[str, Any]] = jobs["items"]
        return items

    def artifact_job(self, job_id: str) -> dict[str, Any]:
        return admin(self.api, "GET", f"{ARTIFACT_JOBS}/{job_id}")

    def deployment(self, deployment_id: str) -> dict[str, Any]:
        return admin(self.api, "GET", f"{DEPLOYMENTS}/{deployment_id}")

    def logs(self) -> str:
        """The tail of every process's log, for a failure's message."""
        parts = [f"--- workers\n{self.workers.logs()[-4000:]}"]
        for node in self.nodes.values():
            parts.append(f"--- agent {node.name}\n{node.agent.output[-1500:]}")
            parts.append(f"--- runtime {node.name}\n{node.runtime.output[-2500:]}")
        return "\n".join(parts)


@pytest.fixture
def service_fleet(
    api_factory: ApiFactory,
    workers: Workers,
    nats_server: EmbeddedNats,
    agents: StartAgent,
    runtimes: StartRuntime,
    hub: HubServer,
    tmp_path: Path,
    llama_server: Path,
    instruct_model: Path,
) -> Iterator[ServiceFleet]:
    """The worker process and the API, with the model on the local Hub; nodes are started
    by the test (ServiceFleet.start_nodes)."""
    hub.state.add(REPOSITORY, REVISION, COMMIT, {GGUF: instruct_model.read_bytes()})
    workers.env.update(WORKER_ENV)
    workers.start(1)
    api = api_factory(
        pipeline=False,
        nats_url=nats_server.url,
        broker_namespace=workers.env["MODELFORGE_NAMESPACE"],
        stale_after_s=STALE_S,
        offline_after_s=OFFLINE_S,
        heartbeat_interval_s=0.5,
        job_lease_s=10,
        job_retry_base_s=0.2,
        artifact_source_url=hub.url,
        gateway_first_token_timeout_s=30,
        gateway_cooldown_s=1,
    )
    home = tmp_path / "nodes"
    home.mkdir()
    yield ServiceFleet(api, hub, workers, home, llama_server, agents, runtimes)
