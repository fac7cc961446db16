"""Stopping `modelforge up`: Ctrl-C is not held up by an agent's open notification
channel; a SIGKILLed `up` takes its children with it; and the next `up` on the same data
dir stops what an earlier one left behind."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from stack.ports import free_port
from tests.api_processes import enrolled
from tests.api_server import OPERATOR_KEY
from tests.held_channel import channel
from tests.up_process import CHILDREN, REPO, StartUp, child_pid

UP_ENV = {"MODELFORGE_OPERATOR_API_KEY": OPERATOR_KEY}


def alive(proc: psutil.Process) -> bool:
    # An orphan's zombie has ended; only init has yet to reap it.
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def still_alive(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Those of procs still running after timeout_s (polled: they are not our children)."""
    deadline = time.monotonic() + timeout_s
    while any(alive(p) for p in procs) and time.monotonic() < deadline:
        time.sleep(0.2)
    return [p for p in procs if alive(p)]


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_up_stops_at_once_while_an_agent_holds_its_notification_channel(
    start_up: StartUp, pg_tmp_path: Path
) -> None:
    port = free_port()
    up = start_up(pg_tmp_path / "data", port, UP_ENV)
    await asyncio.to_thread(up.wait_for, r"ModelForge is up", 180)
    base = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=base, timeout=10, trust_env=False) as operator:
        _, credential = enrolled(operator, "held-while-up-stops")
    async with channel(base, credential) as held:
        began = time.monotonic()
        up.proc.send_signal(signal.SIGINT)
        # The server ends the stream: the agent sees it end and reconnects elsewhere.
        await asyncio.wait_for(held.closed.wait(), 10)
        status = await asyncio.to_thread(up.finish, 120)
        took = time.monotonic() - began
    assert status == 0, up.output
    assert "restarted" not in up.output
    # Before the API ended held channels, this took 43 s (up's patience with a child).
    assert took < 10, f"up took {took:.1f}s to stop:\n{up.output}"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_killed_up_takes_its_children_along(start_up: StartUp, pg_tmp_path: Path) -> None:
    up = start_up(pg_tmp_path / "data", free_port())
    up.wait_for(r"ModelForge is up", timeout_s=180)
    children = {name: psutil.Process(child_pid(up, name)) for name in CHILDREN}
    backends = children["PostgreSQL"].children()
    assert any("postgres modelforge" in " ".join(p.cmdline()) for p in backends), backends
    os.kill(up.proc.pid, signal.SIGKILL)
    up.finish(timeout_s=30)
    # PostgreSQL's backends go with their postmaster, on its fast shutdown.
    left = still_alive([*children.values(), *backends], timeout_s=45)
    assert not left, f"still running after up was killed: {left}"


# An earlier `up` whose children outlived it, as every child did before they were tied
# to `up`'s life: it starts PostgreSQL and the API (on the port the next `up` wants),
# records them as `up` does, and is SIGKILLed.
EARLIER_UP = """
import os, signal, sys
from pathlib import Path
from agent.processes import start_process
from stack.embedded_postgres import EmbeddedPostgres
from stack.leftovers import RECORD_FILE, ChildRecord
from stack.ports import wait_for_tcp
from store.migrate import upgrade

data_dir, port = Path(sys.argv[1]), sys.argv[2]
data_dir.mkdir(mode=0o700)
record = ChildRecord(data_dir / RECORD_FILE)
pg = EmbeddedPostgres(data_dir / "postgres")
pg.start()
record.track("PostgreSQL", pg, signal.SIGINT)
pg.ensure_database("modelforge")
upgrade(pg.url("modelforge"))
env = {**os.environ, "MODELFORGE_DATABASE_URL": pg.url("modelforge"),
       "MODELFORGE_NATS_URL": "nats://127.0.0.1:9", "MODELFORGE_PORT": port}
api = start_process([sys.executable, "-m", "cli.main", "api"], env=env,
                    log_path=data_dir / "earlier-api.log")
record.track("modelforge api", api, signal.SIGTERM)
assert wait_for_tcp("127.0.0.1", int(port), 60)
print(pg.pid, api.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_next_up_stops_what_an_earlier_one_left_running(
    start_up: StartUp, pg_tmp_path: Path
) -> None:
    data_dir = pg_tmp_path / "data"
    port = free_port()
    earlier = subprocess.run(
        [sys.executable, "-c", EARLIER_UP, str(data_dir), str(port)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert earlier.returncode == -signal.SIGKILL, earlier.stderr
    leftovers = [psutil.Process(int(pid)) for pid in earlier.stdout.split()]
    try:
        assert all(alive(p) for p in leftovers)
        up = start_up(data_dir, port)
        up.wait_for(r"ModelForge is up", timeout_s=180)
        for name, proc in zip(("PostgreSQL", "modelforge api"), leftovers, strict=True):
            assert f"stopped {name} (pid {proc.pid})" in up.output, up.output
            assert not alive(proc)
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200
        # What a running `up` started is never taken for a leftover.
        second = start_up(data_dir, free_port())
        assert second.finish(timeout_s=60) == 1
        assert f"another `modelforge up` is running on {data_dir.resolve()}" in second.output
        assert up.interrupt() == 0, up.output
        # A clean stop leaves nothing to find.
        assert not (data_dir / "children.json").exists()
    finally:
        for proc in leftovers:
            if alive(proc):
                proc.kill()
