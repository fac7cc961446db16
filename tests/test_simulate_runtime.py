"""`modelforge simulate --runtime`: simulated runtime workers beside the simulated agents,
through the real protocol against a real API, PostgreSQL and NATS. The test is the
operator and the client only: an artifact acquired on a simulated node, an operator
deployment that becomes ready on it, a chat completion through the gateway that
streams the simulated tokens, a drain that lets an in-flight stream finish, and one
whose deadline cuts a stream (its error event, counted cut)."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from agent.sim_runtime import SIM_BINARY_SHA256
from schemas.protocol import DEPLOYMENTS, GATEWAY_CHAT_COMPLETIONS, RUNTIME_ENVIRONMENTS
from tests.admin_helpers import ok
from tests.agent.harness import REPO, clean_env, wait_until
from tests.api_server import OPERATOR_KEY, ApiFactory, RunningApi
from tests.artifact_flows import COMMIT, REPOSITORY, create_job, get_job
from tests.deployment_flows import create_deployment, service_client, wait_for_deployment
from tests.flows import NODES
from tests.runtime_flows import GGUF, create_profile

ROOT = "/srv/simulated-models"
RATE = 20.0  # tokens per second, per invoke
LOAD_S = 0.5


@dataclass
class Simulation:
    process: subprocess.Popen[str]
    run_id: str
    lines: list[str] = field(default_factory=list)


@contextlib.contextmanager
def simulated(api: RunningApi, nodes: int) -> Iterator[Simulation]:
    """`modelforge simulate --runtime` against the API until the block ends (SIGTERM)."""
    args = [
        sys.executable, "-m", "cli.main", "simulate", "--api-url", api.base_url,
        "--operator-key", OPERATOR_KEY, "--nodes", str(nodes), "--runtime",
        "--devices-per-node", "2", "--device-memory-gib", "24",
        "--tokens-per-s", str(RATE), "--load-s", str(LOAD_S), "--acquire-s", "0.2",
        "--heartbeat-interval", "2", "--runtime-report-interval", "2",
        "--job-poll-interval", "2", "--log-level", "WARNING",
    ]  # fmt: skip
    process = subprocess.Popen(
        args, cwd=REPO, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    assert process.stdout is not None
    first = process.stdout.readline()
    found = re.search(r"\(run ([0-9a-f]+)\)", first)
    assert found, first
    sim = Simulation(process, found.group(1), [first])

    def drain_output() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            sim.lines.append(line)

    reader = threading.Thread(target=drain_output, daemon=True)
    reader.start()
    try:
        yield sim
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        reader.join(10)


def sim_nodes(client: httpx.Client, api: RunningApi, run_id: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = ok(
        client.get(NODES, params={"label": f"sim-run={run_id}"}, headers=api.admin_headers)
    )["items"]
    return items


def online(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [node for node in nodes if node["liveness"] == "online"]


def node_runtime(client: httpx.Client, api: RunningApi, node_id: str) -> dict[str, Any]:
    view: dict[str, Any] = ok(client.get(f"{NODES}/{node_id}/runtime", headers=api.admin_headers))
    return view


def chat(api: RunningApi, secret: str, max_tokens: int) -> Iterator[bytes]:
    """A streamed chat completion's lines, as they arrive."""
    body = {"model": "smol", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens, "stream": True}  # fmt: skip
    with (
        httpx.Client(base_url=api.base_url, timeout=30) as client,
        client.stream(
            "POST", GATEWAY_CHAT_COMPLETIONS, json=body,
            headers={"Authorization": f"Bearer {secret}"},
        ) as response,
    ):  # fmt: skip
        assert response.status_code == 200, response.read()
        yield from (line.encode() for line in response.iter_lines() if line)


def tokens_of(lines: list[bytes]) -> list[str]:
    tokens = []
    for line in lines:
        if line.startswith(b"data: {"):
            for choice in json.loads(line[6:]).get("choices", []):
                content = choice.get("delta", {}).get("content")
                if content:
                    tokens.append(content)
    return tokens


def drained_mid_stream(
    client: httpx.Client,
    api: RunningApi,
    secret: str,
    deployment_id: str,
    max_tokens: int,
    deadline_s: float,
) -> tuple[list[bytes], dict[str, Any]]:
    """A stream of `max_tokens` through the gateway; once its first token arrived, the
    deployment drained with `deadline_s`. The stream's lines once it ended, and the drain
    job's result once the deployment unloaded."""
    received: list[bytes] = []
    first = threading.Event()

    def read() -> None:
        for line in chat(api, secret, max_tokens=max_tokens):
            received.append(line)
            if tokens_of([line]):
                first.set()

    reader = threading.Thread(target=read)
    reader.start()
    assert first.wait(20), received
    drained = client.post(
        f"{DEPLOYMENTS}/{deployment_id}/drain",
        json={"deadline_s": deadline_s},
        headers=api.admin_headers,
    )
    assert drained.status_code == 200 and drained.json()["state"] == "draining", drained.text
    reader.join(30)
    assert not reader.is_alive()
    wait_for_deployment(api, deployment_id, "unloaded", 20)
    jobs = ok(client.get(f"{DEPLOYMENTS}/{deployment_id}/jobs", headers=api.admin_headers))
    [drain] = [j for j in jobs["items"] if j["kind"] == "deployment.drain.v1"]
    result: dict[str, Any] = drain["result"]
    return received, result


@pytest.fixture
def gateway_api(api_factory: ApiFactory) -> RunningApi:
    return api_factory(gateway_first_token_timeout_s=10, gateway_token_gap_timeout_s=10)


def test_simulated_runtime_serves_a_deployment_streams_tokens_and_drains(
    gateway_api: RunningApi,
) -> None:
    api = gateway_api
    with simulated(api, nodes=3) as sim, api.client() as client:
        # Three nodes online, each with its simulated runtime reported: two devices of
        # 24 GiB, nothing loaded, and the simulated binary as its environment.
        # Online means heard: a node's first heartbeat may come a whole interval after
        # it enrolled, and the gateway routes only to online nodes (until then a ready
        # deployment on it answers 503 no_ready_deployment).
        nodes = wait_until(
            lambda: (
                found if len(found := online(sim_nodes(client, api, sim.run_id))) == 3 else None
            ),
            60,
            "three simulated nodes online",
        )
        node_id = sorted(n["id"] for n in nodes)[0]
        runtime = wait_until(
            lambda: view if (view := node_runtime(client, api, node_id))["reported"] else None,
            30,
            "the simulated runtime's report",
        )
        assert [d["device_id"] for d in runtime["devices"]] == ["gpu:0", "gpu:1"]
        assert all(d["memory_free_bytes"] == 24 * 2**30 for d in runtime["devices"])
        assert runtime["environments"][0]["binary_sha256"] == SIM_BINARY_SHA256
        [environment] = [
            e
            for e in ok(client.get(RUNTIME_ENVIRONMENTS, headers=api.admin_headers))["items"]
            if e["binary_sha256"] == SIM_BINARY_SHA256
        ]

        # An artifact job on the node: the simulated agent "writes" the files under the
        # root it offers, and the control plane records them as after a real one.
        # (Once its first inventory, which offers the root, is in.)
        node = type("Node", (), {"node_id": node_id})()

        def acquisition() -> str | None:
            answer = create_job(client, api, node, target_root=ROOT)
            if answer.status_code == 422 and answer.json()["code"] == "target_root_not_allowed":
                return None
            job: str = ok(answer, 201)["id"]
            return job

        job_id = wait_until(acquisition, 30, "the root offered")
        wait_until(
            lambda: get_job(client, api, job_id)["state"] == "succeeded", 30, "the acquisition"
        )

        # An operator deployment on its gpu:1: loaded after the simulated load time.
        profile = create_profile(client, api, name="sim")
        body = {
            "node_id": node_id, "device_id": "gpu:1",
            "artifact": {"repository": REPOSITORY, "commit": COMMIT, "path": GGUF},
            "profile_id": profile["id"], "environment_id": environment["id"],
            "model": "smol", "roles": ["planner"], "max_concurrent": 4,
        }  # fmt: skip
        deployment_id = create_deployment(client, api, body)["id"]
        ready = wait_for_deployment(api, deployment_id, "ready", 30)
        assert ready["node_id"] == node_id and ready["device_id"] == "gpu:1"
        # The report follows: the device's free memory went down by the model.
        loaded = wait_until(
            lambda: view if (view := node_runtime(client, api, node_id))["deployments"] else None,
            20,
            "the loaded deployment reported",
        )
        [device] = [d for d in loaded["devices"] if d["device_id"] == "gpu:1"]
        assert device["memory_free_bytes"] < 24 * 2**30
        assert device["loaded_model"] == "smol"

        # A chat completion through the gateway streams the simulated tokens, paced.
        secret = service_client(client, api)
        started = time.monotonic()
        lines = list(chat(api, secret, max_tokens=10))
        took = time.monotonic() - started
        assert tokens_of(lines) == [f"tok{i} " for i in range(10)], lines
        assert lines[-1] == b"data: [DONE]"
        assert took >= 10 / RATE * 0.9, took

        # A drain while a 60-token stream (3 s) is in flight: the stream finishes whole.
        received, drain = drained_mid_stream(client, api, secret, deployment_id, 60, 30)
        assert tokens_of(received) == [f"tok{i} " for i in range(60)], received[-3:]
        assert received[-1] == b"data: [DONE]"
        assert drain["finished"] == 1 and drain["cut"] == 0, drain
        # The device is free again in the next report.
        wait_until(
            lambda: not node_runtime(client, api, node_id)["deployments"], 20, "the unload reported"
        )

        # A drain whose deadline passes: a 200-token stream (10 s) is cut after 1 s, and
        # ends with the error event a real unload's cut ends with.
        again = create_deployment(client, api, {**body, "device_id": "gpu:0"})["id"]
        wait_for_deployment(api, again, "ready", 30)
        cut, drain = drained_mid_stream(client, api, secret, again, 200, 1)
        assert 0 < len(tokens_of(cut)) < 200, cut[-3:]
        assert any(b"upstream_unavailable" in line for line in cut), cut[-3:]
        assert drain["finished"] == 0 and drain["cut"] == 1, drain
    output = "".join(sim.lines)
    assert sim.process.returncode == 0, output
    assert re.search(r"errors: 0\b", output), output
    assert re.search(r"runtime: [1-9][0-9]* reports, 1 acquisitions, 2 loads", output), output
    assert "1 cut by a drain" in output, output
