"""`modelforge api --processes N`: N API processes serving one port.

This process binds the port once and hands the listening socket to N children (each a
plain `modelforge api` on that descriptor); the kernel gives each new connection to
whichever child accepts first, so an idle process takes the next request and no
balancer is needed. The socket stays open here while a child restarts, so connections
that arrive meanwhile wait in the backlog instead of being refused.

Nothing is shared between the children but PostgreSQL and NATS, which is what makes
them correct side by side: each keeps its own node cache and gateway cache (kept true
by LISTEN, so a revocation reaches every one of them), its own heartbeat buffer, and
its own invoke relay subject (api/gateway/relay.py finds the process that holds a
node's channel over NATS).

Metrics are the exception, since a scrape reaches whichever child accepts it: this
process makes a private directory (mode 0700, removed when it stops) and names it in the
children's environment only, so each child writes its metrics there and `/metrics` on
the port sums them over every child, the dead and replaced ones included
(api/metrics.py).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Mapping, Sequence

from prometheus_client.multiprocess import mark_process_dead

from agent.supervisor import ChildProcess, RestartPolicy, Supervisor, run_children, stop_event
from api.metrics import MULTIPROCESS_DIR_ENV

logger = logging.getLogger("modelforge.api.processes")

# A child's argument: serve on this inherited descriptor instead of binding.
LISTEN_FD_FLAG = "--listen-fd"
# uvicorn's default: connections the kernel queues while every child is busy.
BACKLOG = 2048
# Longer than an API process's own drain (uvicorn waits for open responses; held
# streams are ended at once, api/server.py).
CHILD_STOP_TIMEOUT_S = 40.0


def default_processes() -> int:
    """The machine's cores: each API process is one event loop, one core at most."""
    return max(1, os.cpu_count() or 1)


def listening_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def inherited_socket(fd: int) -> socket.socket:
    """The listener a parent handed down (family and type read from the descriptor)."""
    return socket.socket(fileno=fd)


class ApiProcess(ChildProcess):
    """A child that writes its metrics into `metrics_dir`; once stopped (before each
    restart, and at the end) its live gauges leave the sum, as in gunicorn's child_exit
    hook (its counters and histograms stay: they are what it counted)."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        metrics_dir: str,
        *,
        pass_fds: Sequence[int],
    ) -> None:
        # Tied to this process: killed, it must not leave API processes behind.
        super().__init__(
            argv,
            {**env, MULTIPROCESS_DIR_ENV: metrics_dir},
            stop_timeout_s=CHILD_STOP_TIMEOUT_S,
            parent_death_signal=signal.SIGTERM,
            pass_fds=pass_fds,
        )
        self._metrics_dir = metrics_dir

    def stop(self) -> None:
        pid = self.pid
        super().stop()
        if pid is not None:
            mark_process_dead(pid, self._metrics_dir)  # type: ignore[no-untyped-call]


def supervise(host: str, port: int, processes: int, *, startup_failure: int) -> int:
    """Run `processes` API processes on one listening socket; restart any that dies
    (with backoff); stop them all on SIGINT/SIGTERM, or when one crash-loops."""
    stop = stop_event()
    try:
        sock = listening_socket(host, port)
    except OSError as exc:
        logger.error("cannot listen on %s:%d: %s", host, port, exc.strerror or exc)
        return startup_failure
    fd = sock.fileno()
    # Fresh and private each run, as multiprocess mode requires (no other run's files).
    metrics_dir = tempfile.mkdtemp(prefix="modelforge-api-metrics-")
    try:
        supervisor = Supervisor(RestartPolicy(), say=logger.warning)
        children: list[ChildProcess] = []
        argv = [sys.executable, "-m", "cli.main", "api", "--processes", "1", LISTEN_FD_FLAG]
        for index in range(processes):
            child = ApiProcess([*argv, str(fd)], os.environ, metrics_dir, pass_fds=(fd,))
            child.start()
            children.append(child)
            supervisor.add(f"api process {index}", child)
        logger.info("serving on %s:%d with %d API processes", host, port, processes)
        status = run_children(supervisor, children, stop, "API process")
    finally:
        # Closed once the last child has: until then they hold their copies anyway.
        sock.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)
    return status
