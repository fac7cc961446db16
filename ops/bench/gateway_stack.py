"""The stack ops/bench/gateway.py measures, all real on loopback: `modelforge up` in a
temp data dir, a Hub-layout server with the cached SmolLM2 GGUF, an agent that acquires
it through an artifact job, a runtime worker beside it, a profile and a deployment of
the workload's, a service client; and the direct side (the deployment's own llama-server,
or a second one started here)."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx
import pinning
import yaml
from gateway_rounds import Direct
from gateway_workloads import MODEL, Workload

from schemas.protocol import DEPLOYMENTS, RUNTIME_PROFILES, SERVICE_CLIENTS
from schemas.stack import OPERATOR_KEY_FILE
from stack.ports import free_port
from tests.agent.harness import AgentProcess, wait_until
from tests.api_server import RunningApi
from tests.hub_server import HubServer
from tests.runtime.harness import RuntimeProcess
from tests.runtime.probing import COMMIT, GGUF, REPO, ProbeNode, node_with_model
from tests.up_process import UpProcess, child_pid

# The node at the cadence it has in production (the agent's and runtime worker's
# defaults), not the tests' (see Stack.start_agent).
REAL_CADENCE_AGENT = {"job_poll_interval_s": 5.0, "telemetry_interval_s": 15.0,
                      "inventory_check_interval_s": 30.0, "log_level": "INFO"}  # fmt: skip
REAL_CADENCE_RUNTIME = {"report_interval_s": 30.0}


class StackApi:
    """What the tests' flows use of RunningApi, for the API that `up` runs."""

    def __init__(self, base_url: str, key: str) -> None:
        self.base_url = base_url
        self.key = key

    @property
    def admin_headers(self) -> dict[str, str]:
        return {"X-ModelForge-Admin-Token": self.key}

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=30, trust_env=False, **kwargs)

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        with self.client() as client:
            response = client.post(path, json=body, headers=self.admin_headers)
        if response.status_code not in (200, 201):
            raise SystemExit(f"POST {path}: {response.status_code} {response.text}")
        answer: dict[str, Any] = response.json()
        return answer

    def get(self, path: str) -> dict[str, Any]:
        with self.client() as client:
            response = client.get(path, headers=self.admin_headers)
        response.raise_for_status()
        answer: dict[str, Any] = response.json()
        return answer


@dataclass
class Stack:
    workdir: Path
    up: UpProcess | None = None
    hub: HubServer | None = None
    agents: list[AgentProcess] = field(default_factory=list)
    runtimes: list[RuntimeProcess] = field(default_factory=list)
    direct: subprocess.Popen[bytes] | None = None

    def start_agent(self, config: Path) -> AgentProcess:
        # The tests' flows write a test-speed config (claims polled every 0.3 s,
        # telemetry every 0.5 s, DEBUG logs): at those rates the node's own traffic
        # took 8% of a core in the API, beside llama-server's two threads.
        settings = yaml.safe_load(config.read_text())
        settings.update(REAL_CADENCE_AGENT)
        config.write_text(yaml.safe_dump(settings))
        agent = AgentProcess(config, config.with_suffix(".log"))
        self.agents.append(agent)
        return agent

    def start_runtime(self, name: str = "rt", **settings: Any) -> RuntimeProcess:
        directory = self.workdir / name
        directory.mkdir(exist_ok=True)
        process = RuntimeProcess(directory, {**settings, **REAL_CADENCE_RUNTIME})
        self.runtimes.append(process)
        return process.start()

    def stop(self) -> None:
        """SIGTERM everything started, the direct server first; kill what stays."""
        if self.direct is not None and self.direct.poll() is None:
            self.direct.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.direct.wait(timeout=10)
            if self.direct.poll() is None:
                self.direct.kill()
        for rt in self.runtimes:
            rt.clean_up(timeout_s=30)
        for agent in self.agents:
            with contextlib.suppress(Exception):
                agent.stop()
            agent.kill()
        if self.up is not None:
            self.up.proc.send_signal(signal.SIGTERM)
            try:
                self.up.finish(90)
            except subprocess.TimeoutExpired:
                self.up.kill()
        if self.hub is not None:
            self.hub.stop()


def setup(
    stack: Stack,
    binary: Path,
    model: Path,
    api_env: dict[str, str],
    workload: Workload,
    baseline: str,
) -> tuple[StackApi, str, int, Direct]:
    """The stack up to a ready deployment: (api, client secret, API pid, the direct
    side: the deployment's own llama-server, or a second one started here)."""
    port = free_port()
    env = dict(api_env)
    stack.up = UpProcess(stack.workdir / "data", port, env)
    stack.up.wait_for(r"Operator key: ", timeout_s=180)
    key = (stack.workdir / "data" / OPERATOR_KEY_FILE).read_text().strip()
    api = StackApi(f"http://127.0.0.1:{port}", key)
    stack.hub = HubServer().start()
    running = cast(RunningApi, api)  # the flows use base_url, admin_headers, client()
    node_id, model_file, state = node_with_model(
        running, stack.start_agent, stack.hub, stack.workdir, model
    )
    node = ProbeNode(running, node_id, model_file, state, binary, stack.start_runtime)
    _, environment_id = node.runtime()
    profile = api.post(RUNTIME_PROFILES, {"name": "bench-gateway", "settings": workload.settings})
    endpoints = {"endpoints": workload.endpoints} if workload.endpoints else {}
    deployment = api.post(DEPLOYMENTS, {
        "node_id": node_id, "device_id": "cpu", "profile_id": profile["id"],
        "environment_id": environment_id, "model": MODEL, "roles": ["planner"],
        "artifact": {"repository": REPO, "commit": COMMIT, "path": GGUF},
        "max_concurrent": 64, **endpoints,
    })  # fmt: skip

    def ready() -> bool:
        state = api.get(f"{DEPLOYMENTS}/{deployment['id']}")["state"]
        if state == "failed":
            raise SystemExit(f"the deployment failed: {api.get(DEPLOYMENTS)}")
        return bool(state == "ready")

    wait_until(ready, 180, "the deployment to be ready")
    client = api.post(SERVICE_CLIENTS, {"name": "bench", "models": [MODEL]})
    api_pid = child_pid(stack.up, "modelforge api")
    if baseline == "deployment":
        return api, str(client["secret"]), api_pid, deployment_server(stack.runtimes[0])

    direct_port = free_port()
    argv = workload.direct_argv(binary, model_file, direct_port)
    print("direct:", " ".join(argv[1:]))
    log = (stack.workdir / "direct-llama.log").open("wb")
    stack.direct = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    direct_url = f"http://127.0.0.1:{direct_port}"

    def healthy() -> bool:
        assert stack.direct is not None
        if stack.direct.poll() is not None:
            raise SystemExit(f"the direct llama-server exited; see {log.name}")
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{direct_url}/health", timeout=1, trust_env=False).is_success
        return False

    wait_until(healthy, 60, "the direct llama-server")
    return api, str(client["secret"]), api_pid, Direct(direct_url)


def deployment_server(runtime: RuntimeProcess) -> Direct:
    """The deployment's own llama-server, from its worker's pidfile and key file (this
    bench runs as the worker's user)."""
    record = json.loads((runtime.run_dir / "llama-server-cpu.json").read_text())
    key = (runtime.run_dir / "llama-server-cpu.key").read_text().strip()
    direct = Direct(f"http://127.0.0.1:{record['port']}", key)
    print(f"direct: the deployment's own llama-server, {direct.url}, the worker's key")
    return direct


def pin_model_servers(stack: Stack, cores: frozenset[int]) -> None:
    """The deployment's llama-server (its pid from the runtime worker's pidfile) and the
    direct one onto the model's cores."""
    served = [pid for rt in stack.runtimes if (pid := rt.server_pid()) is not None]
    if not served:
        raise SystemExit("the deployment's llama-server has no pidfile")
    pids = [*served, *([stack.direct.pid] if stack.direct is not None else [])]
    for pid in pids:
        pinning.pin_process(pid, cores)
