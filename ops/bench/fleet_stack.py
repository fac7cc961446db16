"""The fleet bench's stack (ops/bench/fleet.py): a fresh database, nats-server, `modelforge
api` and `modelforge worker` per size, and what is read off their processes: CPU over a
window, RSS, /metrics samples, false liveness transitions."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import heartbeats as hb  # noqa: E402  (sibling bench module: processes, database)

HEARTBEAT_S = 10.0
STALE_S = 30.0
OFFLINE_S = 90.0
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> float:
    """CPU of the processes and of their children that have exited (cutime, cstime):
    PostgreSQL's backends come and go, and counting only the live ones made the
    figure fall, even below zero, when a busy backend ended during the window."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(field) for field in fields[11:15])
    return total / TICKS


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def tree(pid: int) -> list[int]:
    """pid and its descendants (the worker's children, PostgreSQL's backends)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found, stack = [], [pid]
    while stack:
        current = stack.pop()
        found.append(current)
        stack.extend(children.get(current, []))
    return found


def metric(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.split("{")[0].split(" ")[0] != name:
            continue
        if dict(re.findall(r'(\w+)="([^"]*)"', line.split(" ")[0])) == labels:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


class ApiChild:
    """The stack's `modelforge api`, which the return storm stops and starts again."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.argv, self.env, self.log = argv, env, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, url: str) -> int:
        from agent.processes import start_process

        self.proc = start_process(self.argv, env=self.env, log_path=self.log, cwd=hb.ROOT)
        hb.wait_healthy("the API", url, self.proc, self.log)
        return self.proc.pid

    def stop(self) -> None:
        from agent.processes import stop_process

        if self.proc is not None:
            stop_process(self.proc, sig=signal.SIGTERM, timeout_s=45.0)


@contextlib.contextmanager
def stack(
    workdir: Path, env: dict[str, str], api_processes: int
) -> Iterator[tuple[str, str, str, dict[str, int], ApiChild]]:
    """(API URL, operator key, libpq DSN, pids by role, the API) of a fresh stack."""
    from stack.embedded_nats import EmbeddedNats

    admin_key = secrets.token_urlsafe(24)
    with hb.database(workdir, True) as (database_url, _), EmbeddedNats(workdir / "nats") as js:
        common = env | {
            "MODELFORGE_DATABASE_URL": database_url,
            "MODELFORGE_NATS_URL": js.url,
            "MODELFORGE_HEARTBEAT_INTERVAL_S": str(HEARTBEAT_S),
            "MODELFORGE_STALE_AFTER_S": str(STALE_S),
            "MODELFORGE_OFFLINE_AFTER_S": str(OFFLINE_S),
            "MODELFORGE_LOG_LEVEL": "WARNING",
            "MODELFORGE_METRICS_PORT": "0",
        }
        port = hb.free_port()
        api_env = common | {
            "MODELFORGE_OPERATOR_API_KEY": admin_key,
            "MODELFORGE_PORT": str(port),
            "MODELFORGE_DB_POOL_SIZE": "20",
        }
        api_url = f"http://127.0.0.1:{port}"
        dsn = database_url.replace("postgresql+asyncpg://", "postgresql://")
        worker_argv = [sys.executable, "-m", "cli.main", "worker", "--threads", "4"]
        api_argv = [sys.executable, "-m", "cli.main", "api", "--processes", str(api_processes)]
        api = ApiChild(api_argv, api_env, workdir / "api.log")
        with hb.child(worker_argv, common, workdir / "worker.log") as worker:
            try:
                api_pid = api.start(api_url)
                postgres = postgres_pid(workdir)
                pids = {"api": api_pid, "worker": worker.pid, "postgres": postgres}
                yield api_url, admin_key, dsn, pids, api
            finally:
                api.stop()


def postgres_pid(workdir: Path) -> int:
    pidfile = next(workdir.glob("postgres/**/postmaster.pid"))
    return int(pidfile.read_text().splitlines()[0])


async def false_transitions(dsn: str, since: float) -> int:
    connection = await asyncpg.connect(dsn)
    try:
        count: int = await connection.fetchval(
            "SELECT count(*) FROM outbox WHERE envelope->>'action' = 'node.liveness.changed'"
            " AND envelope->'data'->>'current' IN ('stale', 'offline')"
            " AND created_at >= to_timestamp($1)",
            since,
        )
    finally:
        await connection.close()
    return count


@dataclass
class Window:
    """CPU of each role over the measured steady state."""

    pids: dict[str, int]
    since: float = 0.0
    started: float = 0.0
    before: dict[str, float] | None = None
    cpu: dict[str, float] | None = None
    seconds: float = 0.0

    def _now(self, extra: dict[str, list[int]]) -> dict[str, float]:
        groups = {role: tree(pid) for role, pid in self.pids.items()} | extra
        return {role: cpu_seconds(p) for role, p in groups.items()}

    def open(self, generators: list[int]) -> None:
        self.since = time.time()
        self.started = time.monotonic()
        self.before = self._now({"generator": generators})

    def close(self, generators: list[int]) -> None:
        assert self.before is not None
        after = self._now({"generator": generators})
        self.seconds = time.monotonic() - self.started
        self.cpu = {role: after[role] - self.before[role] for role in after}
