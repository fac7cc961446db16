"""Restart crashed children with backoff; give up only on a crash loop.

One policy for `modelforge up` (API, worker, nats-server, PostgreSQL), for
`modelforge worker --processes N`, and for the runtime worker's servers to come; a leaf
beside agent/processes.py, for the same reason: every install can import it.

A child that exits is started again after a delay that doubles with each quick exit
(0.5 s, 1 s, 2 s, ... up to `max_delay_s`) and drops back once the child has stayed up
for `stable_after_s`. More than `max_restarts` exits within `window_s` is a crash
loop: restarting again would only hide the fault, so the supervisor reports it and
stops everything.

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
    started_at: float = 0.0
    exits: deque[float] = field(default_factory=deque)
    quick_exits: int = 0
    restart_at: float | None = None

    def started(self, now: float) -> None:
        self.started_at = now
        self.restart_at = None

    def exited(self, now: float) -> float:
        """Record an exit; the delay before the restart. Raises CrashLoop."""
        self.exits.append(now)
        while self.exits and self.exits[0] < now - self.policy.window_s:
            self.exits.popleft()
        if len(self.exits) > self.policy.max_restarts:
            raise CrashLoop(f"exited {len(self.exits)} times within {self.policy.window_s:.0f}s")
        stable = now - self.started_at >= self.policy.stable_after_s
        self.quick_exits = 0 if stable else self.quick_exits + 1
        backoff = self.policy.first_delay_s * 2.0 ** max(0, self.quick_exits - 1)
        delay = min(self.policy.max_delay_s, backoff)
        self.restart_at = now + delay
        return delay


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

    def add(self, name: str, child: Restartable) -> None:
        """Register a child that the caller has already started."""
        supervised = Supervised(name, child, ChildState(self.policy))
        supervised.state.started(self._clock())
        self.children.append(supervised)

    def poll(self) -> None:
        """One round: notice exits, and start the children whose delay has passed."""
        now = self._clock()
        for child in self.children:
            state = child.state
            if state.restart_at is None:
                status = child.child.exit_status()
                if status is None:
                    continue
                try:
                    delay = state.exited(now)
                except CrashLoop as exc:
                    raise CrashLoop(f"{child.name} {exc} (last exit status {status})") from None
                self._say(f"{child.name} exited with status {status}; restarting in {delay:.1f}s")
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
            try:
                delay = child.state.exited(now)
            except CrashLoop as loop:
                raise CrashLoop(f"{child.name} {loop} (it could not be started)") from None
            self._say(f"retrying {child.name} in {delay:.1f}s")
            return
        child.state.started(self._clock())
        self._say(f"{child.name} restarted")


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
