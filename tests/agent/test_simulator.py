"""The fleet simulator: N simulated agents in one process through the real protocol client.

The quick test runs against an API on a fresh database; the slow one is the load test of
the issue: 500 nodes against `modelforge up`, zero errors, 500 nodes online.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.agent.harness import REPO, clean_env
from tests.api_server import OPERATOR_KEY, RunningApi
from tests.flows import NODES
from tests.up_process import UpProcess

ApiFactory = Callable[..., RunningApi]


def simulate(
    api_url: str | None,
    key: str | None,
    *args: str,
    timeout_s: float = 120,
    data_dir: Path | None = None,
) -> str:
    """Run `modelforge simulate`; with no URL and key it must find them in data_dir."""
    target = []
    if api_url is not None:
        target += ["--api-url", api_url]
    if key is not None:
        target += ["--operator-key", key]
    env = clean_env(**({"MODELFORGE_DATA_DIR": str(data_dir)} if data_dir else {}))
    result = subprocess.run(
        [sys.executable, "-m", "cli.main", "simulate", *target, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert re.search(r"errors: 0\b", output), output
    return output


def sim_nodes(client: httpx.Client, key: str, run_id: str, **query: Any) -> list[dict[str, Any]]:
    response = client.get(
        NODES,
        params={"label": f"sim-run={run_id}", "limit": 1000, **query},
        headers={"X-ModelForge-Admin-Token": key},
    )
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


def run_id_of(output: str) -> str:
    found = re.search(r"\(run ([0-9a-f]+)\)", output)
    assert found, output
    return found.group(1)


def test_simulated_fleet_publishes_without_errors(api_factory: ApiFactory) -> None:
    api = api_factory()
    output = simulate(
        api.base_url,
        OPERATOR_KEY,
        "--nodes",
        "12",
        "--duration",
        "2",
        "--heartbeat-interval",
        "0.5",
        "--telemetry-interval",
        "0.5",
        "--concurrency",
        "8",
    )
    assert "simulated 12/12 nodes" in output
    run_id = run_id_of(output)
    with api.client() as client:
        nodes = sim_nodes(client, OPERATOR_KEY, run_id)
        assert len(nodes) == 12 and all(n["liveness"] == "online" for n in nodes)
        assert {n["labels"]["simulated"] for n in nodes} == {"true"}
        detail = client.get(f"{NODES}/{nodes[0]['id']}", headers=api.admin_headers).json()
    assert len(detail["gpus"]) == 2 and detail["inventory"]["complete"] is True
    assert detail["telemetry"]["gpus"] and detail["telemetry_stream"]["cursor"] >= 2


def test_simulator_needs_an_operator_key(tmp_path: Path) -> None:
    """Without a key and without a running `up` to take it from: one line, status 2."""
    argv = ["simulate", "--nodes", "1", "--api-url", "http://127.0.0.1:9"]
    result = subprocess.run(
        [sys.executable, "-m", "cli.main", *argv],
        cwd=REPO,
        env=clean_env(MODELFORGE_DATA_DIR=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "--operator-key is needed" in result.stderr and "stack.json" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_500_simulated_nodes_against_modelforge_up(
    modelforge_up: Callable[[Path, int], UpProcess], pg_tmp_path: Path
) -> None:
    from stack.ports import free_port

    port = free_port()
    up = modelforge_up(pg_tmp_path / "data", port)
    up.wait_for(r"ModelForge is up", timeout_s=180)
    key = (pg_tmp_path / "data" / "operator_api_key").read_text().strip()
    base = f"http://127.0.0.1:{port}"
    # No URL and no key: the simulator finds both through up's stack file.
    output = simulate(
        None,
        None,
        "--nodes",
        "500",
        "--duration",
        "40",
        # The server's default heartbeat interval; telemetry every 20 s: about 100
        # requests/s in the first 10 s (every node's first heartbeat, inventory and
        # telemetry, staggered), then about 75/s. A busy 2-core machine serves less
        # (68/s measured on a slow day), so the first round of 1,500 requests can take
        # 20 s: 40 s of publishing leaves every node a heartbeat within its interval.
        "--heartbeat-interval",
        "10",
        "--telemetry-interval",
        "20",
        "--inventory-interval",
        "60",
        "--concurrency",
        "24",
        timeout_s=400,
        data_dir=pg_tmp_path / "data",
    )
    assert "simulated 500/500 nodes" in output, output
    run_id = run_id_of(output)
    with httpx.Client(base_url=base, timeout=60, trust_env=False) as client:
        online = sim_nodes(client, key, run_id, liveness="online")
    assert len(online) == 500, output
    assert up.interrupt() == 0, up.output
