"""`modelforge up` is a supervisor: every child it starts is SIGKILLed in turn and comes
back, the stack keeps working; a crash loop of the worker leaves the API serving (the
worker is named in /readyz and retried), and only one of an essential child (here
PostgreSQL) stops everything."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from stack.ports import free_port
from tests.flows import TOKENS
from tests.up_process import CHILDREN, StartUp, UpProcess, child_pid


def wait_until(check: Callable[[], Any], timeout_s: float, what: str, up: UpProcess) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            found = check()
        except (httpx.HTTPError, AssertionError):
            found = None
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"{what} not within {timeout_s}s:\n{up.output}")


def keep_killing(up: UpProcess, name: str, until: Callable[[], bool], timeout_s: float) -> None:
    """SIGKILL the child `name` each time it comes back, until `until()`."""
    deadline = time.monotonic() + timeout_s
    while not until() and time.monotonic() < deadline:
        # Between a death and its restart there is no child to kill.
        with contextlib.suppress(AssertionError, ProcessLookupError):
            os.kill(child_pid(up, name), signal.SIGKILL)
        time.sleep(0.3)
    assert until(), f"{name} killed for {timeout_s}s:\n{up.output}"


def failing(client: httpx.Client) -> list[str] | None:
    response = client.get("/readyz")
    names = [child["name"] for child in response.json()["failing"]]
    return names if response.status_code == 503 and names else None


def ready(client: httpx.Client) -> dict[str, Any] | None:
    response = client.get("/readyz")
    body: dict[str, Any] = response.json()
    return body if response.status_code == 200 and body["ready"] else None


def an_event_flows(client: httpx.Client, key: str) -> bool:
    """A change through the API, and its event published (the outbox drains)."""
    response = client.post(TOKENS, json={}, headers={"X-ModelForge-Admin-Token": key})
    if response.status_code != 201:
        return False
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        body = client.get("/readyz").json()
        if body["outbox"] and body["outbox"]["backlog"] == 0 and body["nats"] == "ok":
            return True
        time.sleep(0.2)
    return False


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_child_of_up_is_restarted_and_only_an_essential_crash_loop_stops_all(
    start_up: StartUp, pg_tmp_path: Path
) -> None:
    data_dir = pg_tmp_path / "data"
    port = free_port()
    up = start_up(data_dir, port)
    up.wait_for(r"ModelForge is up", timeout_s=180)
    assert f"Readiness:    http://127.0.0.1:{port}/readyz" in up.output
    key = (data_dir / "operator_api_key").read_text().strip()
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10, trust_env=False) as client:
        wait_until(lambda: ready(client), 60, "ready", up)
        assert an_event_flows(client, key)
        for name in CHILDREN:
            before = child_pid(up, name)
            restarted = f"{name} restarted"
            restarts = up.output.count(restarted)
            os.kill(before, signal.SIGKILL)
            wait_until(lambda: up.output.count(restarted) > restarts, 90, restarted, up)  # noqa: B023
            assert child_pid(up, name) != before
            assert f"{name} exited with status -9" in up.output
            # The whole pipeline works again: API, database, relay, NATS.
            wait_until(lambda: ready(client), 90, f"ready after {name}", up)
            assert wait_until(lambda: an_event_flows(client, key), 90, "an event", up)
        assert up.proc.poll() is None

        # A crash loop of the worker: failing, retried, and the API keeps serving.
        keep_killing(
            up, "modelforge worker", lambda: "modelforge worker is failing" in up.output, 120
        )
        assert up.proc.poll() is None, up.output
        assert "modelforge worker is failing: exited 6 times within 60s" in up.output
        assert "stopping everything" not in up.output
        assert wait_until(lambda: failing(client), 30, "/readyz naming it", up) == [
            "modelforge worker"
        ]
        response = client.post(TOKENS, json={}, headers={"X-ModelForge-Admin-Token": key})
        assert response.status_code == 201, response.text
        # Left alone, it is retried, stays up, and the stack is whole again.
        restarts = up.output.count("modelforge worker restarted")
        wait_until(
            lambda: up.output.count("modelforge worker restarted") > restarts, 60, "a retry", up
        )
        wait_until(lambda: "modelforge worker recovered" in up.output, 90, "recovery", up)
        wait_until(lambda: ready(client), 60, "ready after the worker's loop", up)
        assert wait_until(lambda: an_event_flows(client, key), 90, "an event", up)

        # A crash loop of PostgreSQL: nothing can be kept, so everything stops.
        tree = up.descendants()
        keep_killing(up, "PostgreSQL", lambda: up.proc.poll() is not None, 180)
    assert up.finish(timeout_s=120) == 1, up.output
    assert re.search(r"PostgreSQL exited \d+ times within 60s", up.output), up.output
    assert "stopping everything" in up.output
    _, alive = psutil.wait_procs(tree, timeout=30)
    assert not alive, f"left running: {alive}"
    assert not (data_dir / "stack.json").exists()
    assert not (data_dir / "supervisor.json").exists()
