"""Real agent processes for the end-to-end tests: `python -m cli.main agent --config ...`.

Each agent's stderr (its whole log) goes to a file the test can read at any time; every
process started here is stopped at teardown.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml

from tests.api_server import RunningApi
from tests.flows import NODES, create_token

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")

# Fast settings for the API under test (see api_factory) and for the agents.
FAST_API = {"heartbeat_interval_s": 0.3, "stale_after_s": 1.0, "offline_after_s": 2.0}
FAST_AGENT: dict[str, Any] = {
    "collector": "simulated",
    "simulated_gpus": 2,
    "telemetry_interval_s": 0.5,
    "inventory_check_interval_s": 0.5,
    "inventory_interval_s": 30,
    "request_timeout_s": 5,
    "retry_initial_s": 0.05,
    "retry_max_s": 0.5,
    "credential_reload_wait_s": 1.0,
    "sequence_block": 4,
    "trust_env": False,
    "log_level": "DEBUG",
}


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELFORGE_")}
    env.update(PYTHONUNBUFFERED="1", **extra)
    return env


def wait_until(check: Callable[[], T | None], timeout_s: float = 20, what: str = "") -> T:
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what or check}: {last!r}")


class AgentProcess:
    def __init__(self, config: Path, log: Path, env: dict[str, str] | None = None) -> None:
        self.config = config
        self.log_path = log
        self._log = log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "agent", "--config", str(config)],
            cwd=REPO,
            env=env or clean_env(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, pattern: str, timeout_s: float = 20) -> re.Match[str]:
        def seen() -> re.Match[str] | None:
            return re.search(pattern, self.output)

        try:
            return wait_until(seen, timeout_s, f"log {pattern!r}")
        except AssertionError:
            raise AssertionError(f"{pattern!r} not logged; log:\n{self.output}") from None

    def wait(self, timeout_s: float = 20) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"agent still running; log:\n{self.output}") from None

    def stop(self, timeout_s: float = 15) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait(timeout_s)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=15)
        self._log.close()


@pytest.fixture
def agents() -> Iterator[Callable[..., AgentProcess]]:
    started: list[AgentProcess] = []

    def start(config: Path, log: Path | None = None, **env: str) -> AgentProcess:
        process = AgentProcess(
            config, log or config.with_suffix(".log"), clean_env(**env) if env else None
        )
        started.append(process)
        return process

    yield start
    for process in started:
        with contextlib.suppress(Exception):
            process.kill()


def write_config(path: Path, **values: Any) -> Path:
    path.write_text(yaml.safe_dump({**FAST_AGENT, **values}))
    return path


def new_token(api: RunningApi, **body: Any) -> str:
    with api.client() as client:
        return create_token(client, api, **body)


def node_detail(api: RunningApi, node_id: str) -> dict[str, Any]:
    with api.client() as client:
        response = client.get(f"{NODES}/{node_id}", headers=api.admin_headers)
        assert response.status_code == 200, response.text
        detail: dict[str, Any] = response.json()
        return detail


def admin(api: RunningApi, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
    with api.client() as client:
        response = client.request(method, path, headers=api.admin_headers, **kwargs)
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body


def identity(state_dir: Path) -> dict[str, Any]:
    import json

    data: dict[str, Any] = json.loads((state_dir / "identity.json").read_text())
    return data


def http_client(api: RunningApi) -> httpx.Client:
    return api.client()


def cursor(api: RunningApi, node_id: str, stream: str) -> int:
    stream_state = node_detail(api, node_id)[f"{stream}_stream"] or {}
    value: int = stream_state.get("cursor", 0)
    return value


def heartbeat_at(api: RunningApi, node_id: str) -> datetime:
    value = node_detail(api, node_id)["last_heartbeat_at"]
    return datetime.fromisoformat(value) if value else datetime.min.replace(tzinfo=UTC)


def advancing(api: RunningApi, node_id: str) -> None:
    """The node is online and its heartbeat and telemetry are moving."""
    before = (heartbeat_at(api, node_id), cursor(api, node_id, "telemetry"))
    wait_until(
        lambda: (
            heartbeat_at(api, node_id) > before[0]
            and cursor(api, node_id, "telemetry") > before[1]
            and node_detail(api, node_id)["liveness"] == "online"
        ),
        what="heartbeat and telemetry advancing",
    )


def nvml_driver_problem() -> str | None:
    """None when NVML works here (a real NVIDIA driver); else why not."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return str(exc)
    pynvml.nvmlShutdown()
    return None
