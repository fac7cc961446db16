"""Real `modelforge api` processes on loopback, for tests that need several, or one to
SIGKILL, and what such tests ask of them."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from agent.processes import start_process, stop_process
from schemas.protocol import ENROLL, HEARTBEAT, NODES, TOKENS
from stack.ports import free_port
from tests.admin_helpers import decommission_body
from tests.agent.harness import wait_until
from tests.api_server import OPERATOR_KEY
from tests.flows import EnrolledNode, enroll_body, heartbeat_body

ADMIN = {"X-ModelForge-Admin-Token": OPERATOR_KEY}


def api_env(database_url: str, nats_url: str, port: int, **settings: str) -> dict[str, str]:
    """The environment of a test's `modelforge api`: this database and NATS, this port,
    the test operator key, and MODELFORGE_<KEY> settings; nothing of the caller's."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("MODELFORGE_")},
        "MODELFORGE_DATABASE_URL": database_url,
        "MODELFORGE_NATS_URL": nats_url,
        "MODELFORGE_OPERATOR_API_KEY": OPERATOR_KEY,
        "MODELFORGE_PORT": str(port),
        "MODELFORGE_LOG_LEVEL": "WARNING",
        **{f"MODELFORGE_{key.upper()}": value for key, value in settings.items()},
    }


def wait_healthy(url: str, log: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)


@contextlib.contextmanager
def api_processes(
    count: int,
    database_url: str,
    nats_url: str,
    log_dir: Path,
    *,
    processes: int = 1,
    **settings: str,
) -> Iterator[list[tuple[str, subprocess.Popen[bytes]]]]:
    """(base URL, process) of `count` API servers, healthy, each on a port of its own
    and each `modelforge api --processes <processes>`; MODELFORGE_<KEY> settings."""
    started: list[tuple[str, subprocess.Popen[bytes]]] = []
    try:
        for i in range(count):
            port = free_port()
            env = api_env(database_url, nats_url, port, **settings)
            argv = [sys.executable, "-m", "cli.main", "api", "--processes", str(processes)]
            proc = start_process(argv, env=env, log_path=log_dir / f"api-{i}.log")
            started.append((f"http://127.0.0.1:{port}", proc))
        for i, (url, _) in enumerate(started):
            wait_healthy(url, log_dir / f"api-{i}.log")
        yield started
    finally:
        for _, proc in started:
            if proc.poll() is None:
                stop_process(proc, timeout_s=45)


def metric(client: httpx.Client, sample: str) -> float:
    """One sample of this API's /metrics, named as written there (labels too); 0 if
    it has none yet."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def fast(client: httpx.Client, route: str, outcome: str) -> float:
    """How many of the route's requests the raw fast path (api/agent/fast_path.py) ended
    with this outcome (answered, declined, …)."""
    return metric(client, f'modelforge_fast_path_total{{outcome="{outcome}",route="{route}"}}')


def cached(client: httpx.Client, node: EnrolledNode) -> None:
    """Heartbeat until the raw route answers the node: it is in the node cache."""
    before = fast(client, HEARTBEAT, "answered")

    def answered() -> bool:
        beat = client.post(HEARTBEAT, json=heartbeat_body(node.node_id), headers=node.headers)
        assert beat.status_code == 200, beat.text
        return fast(client, HEARTBEAT, "answered") > before

    wait_until(answered, 10, "a heartbeat answered by the raw route")


def samples(client: httpx.Client) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of this API's /metrics by name and labels, whatever their order (a
    `--processes N` port writes them sorted, a single process as declared)."""
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def routine_heartbeats(client: httpx.Client) -> float:
    """Heartbeats this API answered from its node cache."""
    return metric(client, 'modelforge_heartbeats_total{path="routine"}')


def heartbeats_answered(client: httpx.Client) -> float:
    """Heartbeats this API accepted, by either path."""
    return routine_heartbeats(client) + metric(
        client, 'modelforge_heartbeats_total{path="transactional"}'
    )


def answered_from_cache(client: httpx.Client, node: EnrolledNode) -> None:
    """Heartbeat until this API answers the node from its node cache (a routine
    heartbeat): its LISTEN connection is up and the node's entry is stored. On a
    `--processes N` port the count is the sum over its processes, so the client's
    connection says which one answered: nothing else may send heartbeats meanwhile."""
    before = routine_heartbeats(client)

    def routine() -> bool:
        beat = client.post(HEARTBEAT, json=heartbeat_body(node.node_id), headers=node.headers)
        assert beat.status_code == 200, beat.text
        return routine_heartbeats(client) > before

    wait_until(routine, 10, "a heartbeat answered from the node cache")


def enrolled(operator: httpx.Client, hostname: str) -> tuple[str, str]:
    token = operator.post(TOKENS, json={}, headers=ADMIN)
    assert token.status_code == 201, token.text
    response = operator.post(ENROLL, json=enroll_body(token.json()["secret"], hostname))
    assert response.status_code == 201, response.text
    return response.json()["node_id"], response.json()["credential"]


# The three ways an operator takes a node's standing away, and what its agent then gets.
REFUSALS = [
    ("revoke", 401, "credential_revoked"),
    ("disable", 403, "node_disabled"),
    ("decommission", 401, "node_decommissioned"),
]


def refuse(operator: httpx.Client, node_id: str, change: str) -> None:
    """Revoke the node's credential, disable it, or decommission it (REFUSALS)."""
    if change == "revoke":
        response = operator.post(f"{NODES}/{node_id}/credential/revoke", headers=ADMIN)
    elif change == "disable":
        response = operator.patch(f"{NODES}/{node_id}", json={"enabled": False}, headers=ADMIN)
    else:
        body = decommission_body(operator, ADMIN, node_id, reason="test")
        response = operator.post(f"{NODES}/{node_id}/decommission", json=body, headers=ADMIN)
    assert response.status_code == 200, response.text
