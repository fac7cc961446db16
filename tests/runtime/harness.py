"""Real runtime workers for the tests: `python -m cli.main runtime --config ...` on
loopback, with the real llama-server (ops/llama/build.py) and a real instruct model."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml

from stack.ports import free_port
from tests.agent.harness import REPO, clean_env, wait_until


def _built(*flags: str) -> Path:
    result = subprocess.run(
        [sys.executable, "ops/llama/build.py", *flags],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(f"ops/llama/build.py {' '.join(flags)} failed:\n{result.stderr[-3000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def llama_server() -> Path:
    """The llama-server binary, built into the cache on first use (minutes)."""
    return _built()


@pytest.fixture(scope="session")
def instruct_model() -> Path:
    """SmolLM2-135M-Instruct, Q4_1 GGUF (98 MB), fetched into the cache on first use."""
    return _built("--model")


def model_entry(model_id: str, path: Path, **fields: Any) -> dict[str, Any]:
    return {"model_id": model_id, "path": str(path), "threads": 2, "ctx_size": 512, **fields}


class RuntimeProcess:
    def __init__(self, directory: Path, settings: dict[str, Any]) -> None:
        self.directory = directory
        self.port = free_port()
        self.run_dir = directory / "run"
        self.settings = {"listen_port": self.port, "run_dir": str(self.run_dir), **settings}
        self.config = directory / "runtime.yaml"
        self.config.write_text(yaml.safe_dump(self.settings))
        self.log_path = directory / "runtime.log"
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *, wait: bool = True) -> RuntimeProcess:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "cli.main", "runtime", "--config", str(self.config)],
                cwd=REPO,
                env=clean_env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        if wait:
            wait_until(self._healthy, 30, f"the runtime worker on {self.url}; log:\n{self.output}")
        return self

    def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"the runtime worker exited; log:\n{self.output}")
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
        return False

    @property
    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, trust_env=False, **{"timeout": 60, **kwargs})

    def server_pid(self, device: str = "cpu") -> int | None:
        """The pid of the device's llama-server, from the worker's pidfile."""
        pidfile = self.run_dir / f"llama-server-{device.replace(':', '-')}.json"
        try:
            return int(json.loads(pidfile.read_text())["pid"])
        except (OSError, ValueError, KeyError):
            return None

    def inventory(self) -> dict[str, Any]:
        with self.client() as client:
            response = client.get("/v1/node/inventory")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    def stop(self, timeout_s: float = 30) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout_s)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=15)

    def clean_up(self, timeout_s: float = 30) -> None:
        """At a test's or a bench's end, whatever state it is in: stop it, kill it if it
        stays, and SIGKILL the llama-server groups its pidfiles still name (a worker
        that was killed leaves them behind)."""
        with contextlib.suppress(Exception):
            self.stop(timeout_s=timeout_s)
        self.kill()
        for pidfile in self.run_dir.glob("llama-server-*.json"):
            with contextlib.suppress(Exception):
                os.killpg(int(json.loads(pidfile.read_text())["pid"]), signal.SIGKILL)


def chat(model: str, content: str = "Say hello.", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], **extra}


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.fixture
def runtimes(tmp_path: Path) -> Iterator[Callable[..., RuntimeProcess]]:
    """Start runtime workers; each is killed at teardown, and so is any llama-server it
    left (found by its pidfiles)."""
    started: list[RuntimeProcess] = []

    def start(name: str = "rt", *, wait: bool = True, **settings: Any) -> RuntimeProcess:
        directory = tmp_path / name
        directory.mkdir(exist_ok=True)
        process = RuntimeProcess(directory, settings)
        started.append(process)
        return process.start(wait=wait)

    yield start
    for process in started:
        process.clean_up(timeout_s=20)
