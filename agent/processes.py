"""Process groups: start a child in its own group, stop it with a signal and then SIGKILL,
and leave nothing behind (a leaf module: it imports nothing of ModelForge).

Shared by `modelforge up` and its embedded servers (stack/), `modelforge worker
--processes` (workers/) and the node's runtime worker (agent/runtime/), which may
import only schemas/ and the agent package; so it lives here, in the agent package that
every install has.

Every child gets its own process group: a Ctrl-C at the terminal then reaches only the
parent, which stops things in dependency order instead of all at once. A child can also
be tied to its parent's life (`parent_death_signal`), so that a parent killed with
SIGKILL, which runs no cleanup, does not leave it running for ever.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import psutil


def as_user(user: str | None) -> dict[str, Any]:
    """Popen/run keyword arguments that drop to `user`, with its own groups only.

    `user=` alone keeps root's group and supplementary groups, and a directory's group
    bits would then apply instead of its "other" bits.
    """
    if user is None:
        return {}
    entry = pwd.getpwnam(user)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


# linux/prctl.h
_PR_SET_PDEATHSIG = 1


def _on_parent_death(sig: signal.Signals) -> Callable[[], None] | None:
    """A preexec_fn that has the kernel send sig to the child when its parent dies.

    Linux only (None elsewhere). The kernel sends it when the *thread* that started the
    child exits, so call start_process from a thread that lives as long as the parent
    (the main thread). It runs after the child has dropped to `user` (a change of
    credentials would clear it). A parent that died before it took effect is seen as
    a new parent pid, and the child then gets sig at once.
    """
    if not sys.platform.startswith("linux"):
        return None
    # Resolved here, in the parent: the child between fork and exec should do no more
    # than the one call.
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def arm() -> None:
        if prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return arm


def start_process(
    argv: Sequence[str],
    *,
    log_path: Path | None = None,
    env: Mapping[str, str] | None = None,
    user: str | None = None,
    cwd: Path | None = None,
    parent_death_signal: signal.Signals | None = None,
    pass_fds: Sequence[int] = (),
) -> subprocess.Popen[bytes]:
    """Start argv in a new process group; output appends to log_path, or is inherited.
    pass_fds: descriptors the child inherits (a listening socket).

    parent_death_signal: the signal the child gets when this process dies, however it
    dies; the one that stops that program cleanly (see _on_parent_death).
    """
    preexec = _on_parent_death(parent_death_signal) if parent_death_signal else None
    log: IO[bytes] | None = None
    if log_path is not None:
        log = log_path.open("ab")
    try:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT if log is not None else None,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            process_group=0,
            preexec_fn=preexec,
            pass_fds=tuple(pass_fds),
            **as_user(user),
        )
    finally:
        # The child holds its own copy of the descriptor.
        if log is not None:
            log.close()


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_process(
    proc: subprocess.Popen[bytes],
    *,
    sig: signal.Signals = signal.SIGTERM,
    timeout_s: float = 10.0,
    whole_group: bool = True,
) -> int:
    """Ask proc (and its group) to stop with sig; SIGKILL everything left after timeout_s.

    Descendants are recorded before signalling, so a grandchild that moved to another
    process group, or was reparented when its parent died, is still found and killed.
    Returns proc's exit status.
    """
    tree = _descendants(proc.pid)
    pgid = proc.pid  # process_group=0 made the child its group's leader
    if proc.poll() is None:
        if whole_group:
            _signal_group(pgid, sig)
        else:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _signal_group(pgid, signal.SIGKILL)
            proc.kill()
            proc.wait(timeout=10.0)
    kill_all(tree, timeout_s=timeout_s)
    _signal_group(pgid, signal.SIGKILL)  # strays that were forked after the snapshot
    return int(proc.returncode)


def kill_all(procs: Sequence[psutil.Process], *, timeout_s: float = 5.0) -> None:
    """Wait briefly for procs to exit on their own, then SIGKILL the rest."""
    alive = [p for p in procs if _is_alive(p)]
    if not alive:
        return
    _, alive = psutil.wait_procs(alive, timeout=timeout_s)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=5.0)


def _is_alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
