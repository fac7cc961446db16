"""`modelforge worker --processes N` ties its workers' lives to its own: a supervisor
killed with SIGKILL (no cleanup runs) leaves no worker behind."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import psutil

from agent.processes import start_process, stop_process
from stack.embedded_nats import EmbeddedNats
from tests.agent.harness import wait_until
from tests.worker_processes import worker_env


def test_a_sigkilled_supervisor_takes_its_workers_with_it(
    database_url: str, nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    env = worker_env(database_url, nats_server.url, f"t{uuid.uuid4().hex[:8]}")
    argv = [sys.executable, "-m", "cli.main", "worker", "--processes", "2", "--threads", "1"]
    supervisor = start_process(argv, env=env, log_path=tmp_path / "supervisor.log")

    def both_started() -> list[psutil.Process] | None:
        children = psutil.Process(supervisor.pid).children()
        return children if len(children) == 2 else None

    try:
        workers = wait_until(both_started, 30, "the supervisor's two workers")
        supervisor.kill()
        supervisor.wait(timeout=10)
        wait_until(
            lambda: not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers),
            45,
            "the workers to stop with their supervisor",
        )
    finally:
        stop_process(supervisor, timeout_s=10)
