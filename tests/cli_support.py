"""Running `modelforge admin …` as an operator does: the real command, a subprocess,
against the test's real API; shared by the CLI's test files, with the fixtures that run
it in tests/cli_fixtures.py.

Answers are read back through the wire models, as a script reading --json would; a
failure must be the one line the CLI promises (`failed`)."""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# A command's whole run (interpreter start, imports, the call) on a loaded 2-core box.
COMMAND_S = 60.0
# An event's trip: commit, relay, NATS, the API's stream, the CLI's line.
ARRIVAL_S = 20.0
ONE_LINE_ERROR = re.compile(r"^error: (?P<code>[a-z_0-9]+): .+ \(correlation id (?P<id>\S+)\)$")

# The fixtures' types (tests/cli_fixtures.py).
Admin = Callable[..., subprocess.CompletedProcess[str]]


def environment(api_url: str | None, key: str | None, data_dir: Path) -> dict[str, str]:
    """The operator's shell: the API's URL and the key, each unless None, and the data
    dir `modelforge up` would keep its stack file and key file in. Nothing else of ours
    comes from the test's own environment: what the test gives is all there is."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELFORGE_")}
    if api_url is not None:
        env["MODELFORGE_API_URL"] = api_url
    if key is not None:
        env["MODELFORGE_OPERATOR_API_KEY"] = key
    env["MODELFORGE_DATA_DIR"] = str(data_dir)
    # This checkout's CLI, from whatever directory the command runs in.
    env["PYTHONPATH"] = str(REPO)
    # Wide enough that a table never folds an id.
    env["COLUMNS"] = "250"
    return env


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "cli.main", "admin", *args]


def run_command(
    *args: str, env: dict[str, str], stdin: str = "", cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command(*args),
        env=env,
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=COMMAND_S,
        check=False,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"rc {result.returncode}: {result.stderr}"
    assert "Traceback" not in result.stderr
    return result.stdout


def failed(result: subprocess.CompletedProcess[str], code: str) -> re.Match[str]:
    """A refusal as the CLI must say it: exit 1, nothing on stdout, one line on stderr
    with the API's code and the correlation id; never a traceback."""
    assert result.returncode == 1, f"rc {result.returncode}: {result.stdout}{result.stderr}"
    assert result.stdout == "", result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    line = result.stderr.strip()
    assert "\n" not in line, result.stderr
    match = ONE_LINE_ERROR.match(line)
    assert match is not None and match["code"] == code, line
    return match


def containing(*parts: str) -> Callable[[str], bool]:
    """For Running.line: a line with every one of these in it."""
    return lambda line: all(part in line for part in parts)


class Running:
    """A command left running (a watch): its stdout lines as they come."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def line(self, wanted: Callable[[str], bool], timeout_s: float = ARRIVAL_S) -> str:
        """The next line that `wanted` accepts, within the bound."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("no such line within the bound")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                assert self.process.stderr is not None
                raise AssertionError(f"the command ended: {self.process.stderr.read()}")
            if wanted(line):
                return line
