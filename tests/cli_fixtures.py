"""The `admin` and `background` fixtures: `modelforge admin …` as a subprocess against
the test's `api` (a test module may override `api` to give the API other settings).
`admin` runs a command to its end; `background` leaves one running (a watch) and reads
its lines as they come.

A plugin, loaded by the CLI's test files with `pytest_plugins = ["tests.cli_fixtures"]`;
never imported by name (so pytest rewrites its asserts). The helpers they use, and that
the tests read the results with, are in tests/cli_support.py."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.api_server import OPERATOR_KEY, RunningApi
from tests.cli_support import Admin, Running, command, environment, run_command


@pytest.fixture
def admin(api: RunningApi, tmp_path: Path) -> Admin:
    def run(
        *args: str, key: str | None = OPERATOR_KEY, stdin: str = ""
    ) -> subprocess.CompletedProcess[str]:
        return run_command(
            *args, env=environment(api.base_url, key, tmp_path / "no-stack"), stdin=stdin
        )

    return run


@pytest.fixture
def background(api: RunningApi, tmp_path: Path) -> Iterator[Callable[..., Running]]:
    started: list[subprocess.Popen[str]] = []

    def start(
        *args: str, stdin: int = subprocess.DEVNULL, key: str | None = OPERATOR_KEY
    ) -> Running:
        process = subprocess.Popen(
            command(*args),
            env=environment(api.base_url, key, tmp_path / "no-stack"),
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(process)
        return Running(process)

    yield start
    for process in started:
        if process.poll() is None:
            process.terminate()
        process.wait(timeout=10)
