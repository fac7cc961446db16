"""The `admin` and `background` fixtures: `modelforge admin …` as a subprocess against
the test's `api` (a test module may override `api` to give the API other settings).
`admin` runs a command to its end; `background` leaves one running (a watch) and reads
its lines as they come. `tty_admin` and `tty_background` do the same with stdout on a
pseudo-terminal, where Rich colours as in an operator's shell.

A plugin, loaded by the CLI's test files with `pytest_plugins = ["tests.cli_fixtures"]`;
never imported by name (so pytest rewrites its asserts). The helpers they use, and that
the tests read the results with, are in tests/cli_support.py."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.api_server import OPERATOR_KEY, RunningApi
from tests.cli_support import (
    TTY_COLUMNS,
    Admin,
    Running,
    command,
    environment,
    run_command,
    run_on_tty,
    start_on_tty,
)


@pytest.fixture
def admin(api: RunningApi, tmp_path: Path) -> Admin:
    def run(
        *args: str, key: str | None = OPERATOR_KEY, stdin: str = "", columns: int | None = None
    ) -> subprocess.CompletedProcess[str]:
        env = environment(api.base_url, key, tmp_path / "no-stack")
        if columns is not None:
            env["COLUMNS"] = str(columns)
        return run_command(*args, env=env, stdin=stdin)

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


@pytest.fixture
def tty_admin(api: RunningApi, tmp_path: Path) -> Admin:
    def run(
        *args: str, key: str | None = OPERATOR_KEY, columns: int = TTY_COLUMNS
    ) -> subprocess.CompletedProcess[str]:
        env = environment(api.base_url, key, tmp_path / "no-stack")
        return run_on_tty(*args, env=env, columns=columns)

    return run


@pytest.fixture
def tty_background(api: RunningApi, tmp_path: Path) -> Iterator[Callable[..., Running]]:
    started: list[Running] = []

    def start(*args: str, key: str | None = OPERATOR_KEY) -> Running:
        running = start_on_tty(*args, env=environment(api.base_url, key, tmp_path / "no-stack"))
        started.append(running)
        return running

    yield start
    for running in started:
        if running.process.poll() is None:
            running.process.terminate()
        running.process.wait(timeout=10)
        if running.process.stderr is not None:
            running.process.stderr.close()
