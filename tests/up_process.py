"""`modelforge up` as a subprocess for tests, and the `start_up` fixture (a plugin)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parent.parent


class UpProcess:
    """`modelforge up` as a subprocess, its output collected by a thread."""

    def __init__(
        self,
        data_dir: Path,
        port: int,
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
    ) -> None:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("MODELFORGE_")},
            "MODELFORGE_DATA_DIR": str(data_dir),
            "MODELFORGE_PORT": str(port),
            **(env or {}),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "up", *args],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, timeout_s: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = re.search(pattern, self.output)
            if found:
                return found
            if self.proc.poll() is not None:
                time.sleep(0.5)  # let the reader drain the pipe
                raise AssertionError(f"up exited {self.proc.returncode}:\n{self.output}")
            time.sleep(0.2)
        raise AssertionError(f"{pattern!r} not seen within {timeout_s}s:\n{self.output}")

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def finish(self, timeout_s: float) -> int:
        """Wait for exit and for the rest of the output."""
        code = self.proc.wait(timeout=timeout_s)
        self._reader.join(timeout=timeout_s)
        return code

    def interrupt(self, timeout_s: float = 90) -> int:
        self.proc.send_signal(signal.SIGINT)
        return self.finish(timeout_s)

    def kill(self) -> None:
        """Last-resort cleanup for a failed test: nothing may outlive it."""
        tree = self.descendants()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        for p in tree:
            with contextlib.suppress(psutil.Error):
                p.kill()
        self._reader.join(timeout=10)


# What tells each child apart in `ps`; the name `up` reports it by.
def _command(argv: list[str]) -> str | None:
    """The `modelforge` subcommand of a `python -m cli.main <command> ...` argv."""
    if "cli.main" in argv[:-1]:
        return argv[argv.index("cli.main") + 1]
    return None


CHILDREN: dict[str, Callable[[list[str]], bool]] = {
    "modelforge api": lambda argv: _command(argv) == "api",
    "modelforge worker": lambda argv: _command(argv) == "worker",
    "nats-server": lambda argv: bool(argv) and argv[0].endswith("nats-server"),
    "PostgreSQL": lambda argv: bool(argv) and argv[0].endswith("/postgres") and "-D" in argv,
}


def child_pid(up: UpProcess, name: str) -> int:
    """The pid of up's child called name (CHILDREN)."""
    for proc in psutil.Process(up.proc.pid).children():
        try:
            if CHILDREN[name](proc.cmdline()):
                return proc.pid
        except psutil.Error:
            continue
    raise AssertionError(f"no {name} among the children of up:\n{up.output}")


StartUp = Callable[..., UpProcess]


@pytest.fixture
def start_up() -> Iterator[StartUp]:
    """start_up(data_dir, port, env=None, args=()): `modelforge up [args]`, killed after
    the test."""
    started: list[UpProcess] = []

    def start(
        data_dir: Path, port: int, env: Mapping[str, str] | None = None, args: Sequence[str] = ()
    ) -> UpProcess:
        up = UpProcess(data_dir, port, env, args)
        started.append(up)
        return up

    yield start
    for up in started:
        up.kill()
