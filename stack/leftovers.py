"""What `modelforge up` started, recorded in its data dir, so that the next `up` there
stops what an earlier one left running.

Every child of `up` dies with it (a parent-death signal, agent/processes.py), but not
always at once or at all: a child that is stopped (SIGSTOP, a debugger), wedged, or slow
to handle the signal outlives `up`, holding the API port and the data dirs, and nothing
would ever stop it. So each child's pid, start time and stopping signal are kept in
`<data dir>/children.json`, rewritten whenever they change (a restarted child has a new
pid). The next `up` holds the data dir's lock before it reads the record, so no live
`up` owns the processes named there; each one still running with the same start time (a
pid can be reused) is stopped with its signal, then killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import psutil

RECORD_FILE = "children.json"
# A leftover worker may be draining an actor; what it had not acked is delivered again.
STOP_TIMEOUT_S = 15.0
_POLL_S = 0.1


@dataclass(frozen=True)
class Recorded:
    name: str
    pid: int
    create_time: float
    stop_signal: str


class Child(Protocol):
    """EmbeddedPostgres, EmbeddedNats, ChildProcess: None before the first start."""

    @property
    def pid(self) -> int | None: ...


class ChildRecord:
    """The record one `up` keeps of its children."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._tracked: list[tuple[str, Child, signal.Signals]] = []
        # The (name, pid) pairs last written.
        self._written: list[tuple[str, int]] | None = None

    def track(self, name: str, child: Child, stop_signal: signal.Signals) -> None:
        """Record child's current process from now on (its pid read at every refresh)."""
        self._tracked.append((name, child, stop_signal))
        self.refresh()

    def refresh(self) -> None:
        """Rewrite the record if a tracked child has a new pid; cheap when none has."""
        current = [
            (name, number, stop_signal)
            for name, child, stop_signal in self._tracked
            if (number := child.pid) is not None
        ]
        pids = [(name, number) for name, number, _ in current]
        if pids == self._written:
            return
        entries: list[Recorded] = []
        for name, pid, stop_signal in current:
            with contextlib.suppress(psutil.Error):
                started = psutil.Process(pid).create_time()
                entries.append(Recorded(name, pid, started, stop_signal.name))
        # Renamed into place: a reader never sees half a record.
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps([asdict(entry) for entry in entries]))
        tmp.replace(self.path)
        self._written = pids

    def clear(self) -> None:
        """After a clean stop: nothing is left to find."""
        self.path.unlink(missing_ok=True)
        self._written = None


def _read(path: Path) -> list[Recorded]:
    try:
        return [Recorded(**entry) for entry in json.loads(path.read_text())]
    except FileNotFoundError:
        return []
    except (OSError, ValueError, TypeError):
        # Unreadable: what it named cannot be told from a reused pid, so nothing is stopped.
        return []


def _still_running(entry: Recorded) -> psutil.Process | None:
    with contextlib.suppress(psutil.Error):
        proc = psutil.Process(entry.pid)
        if abs(proc.create_time() - entry.create_time) < 0.01 and _alive(proc):
            return proc
    return None


def _alive(proc: psutil.Process) -> bool:
    # A zombie has ended; only its parent (init, for an orphan) has yet to reap it.
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _wait_gone(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Those of procs still alive after timeout_s. Polled: psutil.wait_procs waits out
    the whole timeout for a zombie that is not our child."""
    deadline = time.monotonic() + timeout_s
    alive = [p for p in procs if _alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(_POLL_S)
        alive = [p for p in alive if _alive(p)]
    return alive


def _kill(proc: psutil.Process) -> None:
    """SIGKILL proc, and its process group when it leads one (PostgreSQL's backends)."""
    with contextlib.suppress(ProcessLookupError, PermissionError, psutil.Error):
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()


def stop_leftovers(path: Path, timeout_s: float = STOP_TIMEOUT_S) -> list[Recorded]:
    """Stop the processes recorded at path that still run; those that did, by name and
    pid. The caller must hold the data dir's lock. The record is removed."""
    found = [(entry, proc) for entry in _read(path) if (proc := _still_running(entry))]
    for entry, proc in found:
        with contextlib.suppress(psutil.Error, KeyError):
            proc.send_signal(signal.Signals[entry.stop_signal])
            # A stopped process acts on the signal only once it runs again.
            proc.resume()
    stubborn = _wait_gone([proc for _, proc in found], timeout_s)
    for proc in stubborn:
        _kill(proc)
    _wait_gone(stubborn, timeout_s=5.0)
    path.unlink(missing_ok=True)
    return [entry for entry, _ in found]
