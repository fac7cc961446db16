"""Running `modelforge admin …` as an operator does: the real command, a subprocess,
against the test's real API; shared by the CLI's test files, with the fixtures that run
it in tests/cli_fixtures.py.

Answers are read back through the wire models, as a script reading --json would; a
failure must be the one line the CLI promises (`failed`)."""

from __future__ import annotations

import codecs
import fcntl
import os
import pty
import queue
import re
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterable, Iterator
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
    """A command left running (a watch): its stdout lines as they come (from its pipe, or
    from the terminal it writes to: `lines`)."""

    def __init__(self, process: subprocess.Popen[str], lines: Iterable[str] | None = None) -> None:
        self.process = process
        self.lines: queue.Queue[str | None] = queue.Queue()
        source = lines if lines is not None else process.stdout
        assert source is not None
        threading.Thread(target=self._read, args=(source,), daemon=True).start()

    def _read(self, source: Iterable[str]) -> None:
        for line in source:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def rest(self, timeout_s: float = COMMAND_S) -> list[str]:
        """Every line still to come, once the command has ended (within the bound)."""
        deadline = time.monotonic() + timeout_s
        lines: list[str] = []
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                return lines
            lines.append(line)
        raise AssertionError("the command's output did not end within the bound")

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


# The terminal the TTY commands write to: wide, so no row folds, and one Rich colours.
TTY_COLUMNS = 400


def tty_environment(env: dict[str, str], columns: int = TTY_COLUMNS) -> dict[str, str]:
    """An operator's colour terminal, `columns` wide: whatever the test's own
    environment says of colours (NO_COLOR, FORCE_COLOR, a dumb TERM) is left out."""
    quiet = {"NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "TERM", "LINES"}
    return {
        **{k: v for k, v in env.items() if k not in quiet},
        "TERM": "xterm-256color",
        "COLUMNS": str(columns),
    }


def _terminal_lines(master: int) -> Iterator[str]:
    """What the command wrote to its terminal, a line at a time, exactly as the terminal
    received it (escape sequences included; the terminal's CR before each LF removed)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    pending = ""
    try:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the command and every copy of its terminal closed
                chunk = b""
            if not chunk:
                break
            pending += decoder.decode(chunk)
            *whole, pending = pending.split("\n")
            for line in whole:
                yield line.removesuffix("\r")
        if pending:
            yield pending
    finally:
        os.close(master)


def start_on_tty(*args: str, env: dict[str, str], columns: int = TTY_COLUMNS) -> Running:
    """The command with its stdout on a pseudo-terminal `columns` wide (stderr a pipe):
    Rich sees a real terminal and colours, as in an operator's shell."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    try:
        process = subprocess.Popen(
            command(*args),
            env=tty_environment(env, columns),
            stdin=subprocess.DEVNULL,
            stdout=slave,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        os.close(slave)
    return Running(process, _terminal_lines(master))


def run_on_tty(
    *args: str, env: dict[str, str], columns: int = TTY_COLUMNS
) -> subprocess.CompletedProcess[str]:
    """start_on_tty to the command's end: its terminal's text as stdout."""
    running = start_on_tty(*args, env=env, columns=columns)
    try:
        running.process.wait(timeout=COMMAND_S)
    finally:
        if running.process.poll() is None:
            running.process.kill()
    stdout = "\n".join(running.rest())
    assert running.process.stderr is not None
    stderr = running.process.stderr.read()
    running.process.stderr.close()
    return subprocess.CompletedProcess(
        running.process.args, running.process.returncode, stdout, stderr
    )
