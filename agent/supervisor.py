"""Restart crashed children with backoff; give up only on a crash loop.

One policy for `modelforge up` (API, worker, nats-server, PostgreSQL), for
`modelforge worker --processes N`, and for the runtime worker's servers to come; a leaf
beside agent/processes.py, for the same reason: every install can import it.

A child that exits is started again after a delay that doubles with each quick exit
(0.5 s, 1 s, 2 s, ... up to `max_delay_s`) and drops back once the child has stayed up
for `stable_after_s`. More than `max_restarts` exits within `window_s` is a crash
loop. Of an essential child (added with essential=True, the default) it stops
everything: restarting again would only hide the fault. A child the rest can do
without (essential=False) is marked failing instead, reported (`failing()`), and
retried every `max_delay_s` until it stays up for `stable_after_s`: its fault may be
outside it (a server it waits for), and stopping the rest would only widen the outage.

The policy is pure bookkeeping over timestamps, so it is tested without processes; the
loop that applies it polls children and never blocks on one child's backoff.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from agent.processes import start_process, stop_process

logger = logging.getLogger("modelforge.supervisor")


@dataclass(frozen=True)
class RestartPolicy:
    first_delay_s: float = 0.5
    max_delay_s: float = 10.0
    # Up this long: the next exit is treated as a first one again.
    stable_after_s: float = 30.0
    # More than max_restarts exits within window_s: a crash loop.
    max_restarts: int = 5
    window_s: float = 60.0


class CrashLoop(Exception):
    """A child keeps dying; the message says which and how often."""


@dataclass
class ChildState:
    """What the supervisor remembers about one child."""

    policy: RestartPolicy
    essential: bool = True
    started_at: float = 0.0
    exits: deque[float] = field(default_factory=deque)
    quick_exits: int = 0
    restart_at: float | None = None
    # Why a non-essential child is failing (it crash-looped); None while it is not.
    failing: str | None = None

    def started(self, now: float) -> None:
        self.started_at = now
        self.restart_at = None

    def exited(self, now: float, status: str) -> float:
        """Record an exit (status: how it ended, for the report); the delay before the
        restart. Raises CrashLoop when an essential child loops."""
        self.exits.append(now)
        while self.exits and self.exits[0] < now - self.policy.window_s:
            self.exits.popleft()
        if len(self.exits) > self.policy.max_restarts:
            loop = f"exited {len(self.exits)} times within {self.policy.window_s:.0f}s"
            if self.essential:
                raise CrashLoop(f"{loop} ({status})")
            self.failing = f"{loop} ({status})"
        stable = now - self.started_at >= self.policy.stable_after_s
        self.quick_exits = 0 if stable else self.quick_exits + 1
        backoff = self.policy.first_delay_s * 2.0 ** max(0, self.quick_exits - 1)
        delay = self.policy.max_delay_s if self.failing else min(self.policy.max_delay_s, backoff)
        self.restart_at = now + delay
        return delay

    def recovered(self, now: float) -> bool:
        """True once, when a failing child has stayed up for stable_after_s: its loop is
        over, and its exits so far no longer count."""
        if self.failing is None or self.restart_at is not None:
            return False
        if now - self.started_at < self.policy.stable_after_s:
            return False
        self.failing = None
        self.exits.clear()
        return True


class Restartable(Protocol):
    """A child the supervisor can manage: EmbeddedPostgres, EmbeddedNats, ChildProcess."""

    def start(self) -> None: ...

    def exit_status(self) -> int | None:
        """The exit status once it died; None while it runs."""
        ...

    def stop(self) -> None:
        """Stop it if it runs, and reap what is left of it."""
        ...


class ChildProcess:
    """One command in its own process group, started again on demand."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        stop_timeout_s: float,
        parent_death_signal: signal.Signals | None = None,
        pass_fds: Sequence[int] = (),
    ) -> None:
        self._argv = list(argv)
        self._pass_fds = tuple(pass_fds)
        self._env = dict(env)
        self._stop_timeout_s = stop_timeout_s
        # What the child gets if this process dies without stopping it (agent/processes.py).
        self._parent_death_signal = parent_death_signal
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> None:
        self.proc = start_process(
            self._argv,
            env=self._env,
            parent_death_signal=self._parent_death_signal,
            pass_fds=self._pass_fds,
        )

    def exit_status(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    def signal(self, sig: signal.Signals) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, sig=signal.SIGTERM, timeout_s=self._stop_timeout_s)


@dataclass
class Supervised:
    name: str
    child: Restartable
    state: ChildState


class Supervisor:
    """Polls children; restarts the dead with backoff; raises CrashLoop when one loops."""

    def __init__(
        self,
        policy: RestartPolicy,
        *,
        say: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.children: list[Supervised] = []
        self._say = say
        self._clock = clock

    def add(self, name: str, child: Restartable, *, essential: bool = True) -> None:
        """Register a child that the caller has already started. essential=False: its
        crash loop marks it failing (and it is retried) instead of stopping everything."""
        supervised = Supervised(name, child, ChildState(self.policy, essential=essential))
        supervised.state.started(self._clock())
        self.children.append(supervised)

    def failing(self) -> dict[str, str]:
        """The non-essential children that crash-looped and have not recovered: why."""
        return {c.name: c.state.failing for c in self.children if c.state.failing is not None}

    def poll(self) -> None:
        """One round: notice exits, and start the children whose delay has passed."""
        now = self._clock()
        for child in self.children:
            state = child.state
            if state.restart_at is None:
                status = child.child.exit_status()
                if status is None:
                    if state.recovered(now):
                        self._say(f"{child.name} recovered (up {now - state.started_at:.0f}s)")
                    continue
                was_failing = state.failing is not None
                try:
                    delay = state.exited(now, f"last exit status {status}")
                except CrashLoop as exc:
                    raise CrashLoop(f"{child.name} {exc}") from None
                self._say(f"{child.name} exited with status {status}; restarting in {delay:.1f}s")
                if not was_failing and state.failing is not None:
                    self._report_failing(child)
            elif now >= state.restart_at:
                self._restart(child, now)

    def _restart(self, child: Supervised, now: float) -> None:
        try:
            child.child.stop()  # reaps what is left of it, releases its locks
            child.child.start()
        except Exception as exc:
            # A failed start is one more exit: the backoff and the crash-loop count apply.
            child.state.started_at = now
            child.state.restart_at = None
            self._say(f"{child.name} could not be restarted: {exc}")
            was_failing = child.state.failing is not None
            try:
                delay = child.state.exited(now, "it could not be started")
            except CrashLoop as loop:
                raise CrashLoop(f"{child.name} {loop}") from None
            self._say(f"retrying {child.name} in {delay:.1f}s")
            if not was_failing and child.state.failing is not None:
                self._report_failing(child)
            return
        child.state.started(self._clock())
        self._say(f"{child.name} restarted")

    def _report_failing(self, child: Supervised) -> None:
        self._say(
            f"{child.name} is failing: {child.state.failing}; the rest keeps running, and "
            f"it is retried every {self.policy.max_delay_s:.0f}s"
        )


def stop_event() -> threading.Event:
    """Set by SIGINT or SIGTERM: how a supervising command learns to stop."""
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    return stop


def run_children(
    supervisor: Supervisor, children: Sequence[ChildProcess], stop: threading.Event, what: str
) -> int:
    """Keep the supervisor's children going until `stop` is set (0) or one crash-loops
    (1); then stop them all at once, so that their drains overlap."""
    status = 0
    while not stop.wait(0.5):
        try:
            supervisor.poll()
        except CrashLoop as exc:
            logger.error("%s; stopping every %s", exc, what)
            status = 1
            break
    for child in children:
        child.signal(signal.SIGTERM)
    for child in children:
        child.stop()
    return status
