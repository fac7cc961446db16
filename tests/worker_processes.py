"""Real `modelforge worker` processes for tests, on the test's PostgreSQL and a private
NATS (the `nats_server` fixture), so a test may SIGKILL one or stop the broker."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dramatiq
import pytest

from agent.processes import start_process, stop_process
from broker.jetstream import BrokerSettings, build_broker
from stack.embedded_nats import EmbeddedNats
from tests.api_server import PRESENCE_GAP_S, ApiFactory, RunningApi

STALE_S = 2.0
OFFLINE_S = 4.0


def worker_env(database_url: str, nats_url: str, namespace: str) -> dict[str, str]:
    return {
        **os.environ,
        "MODELFORGE_DATABASE_URL": database_url,
        "MODELFORGE_NATS_URL": nats_url,
        "MODELFORGE_NAMESPACE": namespace,
        "MODELFORGE_STALE_AFTER_S": str(STALE_S),
        "MODELFORGE_OFFLINE_AFTER_S": str(OFFLINE_S),
        "MODELFORGE_SWEEP_PERIOD_S": "0.2",
        "MODELFORGE_ACK_WAIT_S": "3",
        # A killed worker's unacked events come back to the others this soon.
        "MODELFORGE_CONSUMER_ACK_WAIT_S": "3",
        "MODELFORGE_METRICS_PORT": "0",
        "MODELFORGE_LOG_LEVEL": "INFO",
        # These tests silence the whole fleet on purpose; with the partition breaker
        # armed that would (rightly) hold every offline transition. It has its own
        # tests (tests/test_fleet_safety.py).
        "MODELFORGE_PARTITION_MIN_NODES": "1000000",
        "MODELFORGE_PRESENCE_GAP_S": str(PRESENCE_GAP_S),
    }


class Workers:
    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = env
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, count: int) -> None:
        for _ in range(count):
            log = self.log_dir / f"worker-{len(self.procs)}.log"
            argv = [sys.executable, "-m", "cli.main", "worker", "--threads", "2"]
            self.procs.append(start_process(argv, env=self.env, log_path=log))

    def logs(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.log_dir.glob("worker-*.log")))

    def stop_all(self) -> None:
        for proc in self.procs:
            stop_process(proc, timeout_s=40)

    def api(self, api_factory: ApiFactory) -> RunningApi:
        """An API on these workers' NATS and namespace, on their liveness thresholds; no
        pipeline of its own (these worker processes relay and audit)."""
        return api_factory(
            stale_after_s=STALE_S,
            offline_after_s=OFFLINE_S,
            nats_url=self.env["MODELFORGE_NATS_URL"],
            broker_namespace=self.env["MODELFORGE_NAMESPACE"],
            pipeline=False,
        )

    def enqueue_poison(self) -> dramatiq.Message[Any]:
        """A message its actor always fails on (a period that is not one), enqueued on
        these workers' broker as any producer would: dead-lettered after 3 runs."""
        settings = BrokerSettings(
            nats_url=self.env["MODELFORGE_NATS_URL"], namespace=self.env["MODELFORGE_NAMESPACE"]
        )
        broker = build_broker(settings, client_name="test-producer")
        try:
            message: dramatiq.Message[Any] = dramatiq.Message(
                queue_name="liveness",
                actor_name="liveness_sweep",
                args=("not-a-period",),
                kwargs={},
                options={"max_retries": 2, "min_backoff": 100, "max_backoff": 200},
            )
            broker.enqueue(message)
        finally:
            broker.close()
        return message


@pytest.fixture
def workers(database_url: str, nats_server: EmbeddedNats, tmp_path: Path) -> Iterator[Workers]:
    running = Workers(
        worker_env(database_url, nats_server.url, f"t{uuid.uuid4().hex[:8]}"), tmp_path
    )
    yield running
    running.stop_all()
