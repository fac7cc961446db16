"""`modelforge up`: the one-command local stack.

Embedded PostgreSQL and NATS (unless URLs are given), migrations, then `modelforge api` and
`modelforge worker` as child processes. Every child, the embedded servers included, is
restarted with backoff when it dies (agent/supervisor.py). A crash loop of the API or of
PostgreSQL stops the stack: without them nothing is served or kept. One of the worker or
of nats-server does not: the API keeps accepting changes into the outbox, which the
relay publishes once both run again; that child is marked failing, named in `/readyz`
(through `<data dir>/supervisor.json`) and in this process's log, and retried at the
capped backoff. Clients find the stack through `<data dir>/stack.json` (schemas/stack.py).

Every child dies with `up`, even a SIGKILLed one (a parent-death signal), and what
outlives it anyway is stopped by the next `up` on the same data dir (stack/leftovers.py).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from urllib.parse import urlsplit, urlunsplit

import httpx

from agent.supervisor import ChildProcess, CrashLoop, RestartPolicy, Supervisor
from schemas.health import FailingChild
from schemas.hub import SOURCE_URL_ENV, source_shown
from schemas.stack import (
    OPERATOR_KEY_FILE,
    SUPERVISOR_STATE_ENV,
    SUPERVISOR_STATE_FILE,
    StackInfo,
    SupervisorState,
    write_stack_info,
    write_supervisor_state,
)
from stack.leftovers import RECORD_FILE, ChildRecord, stop_leftovers
from stack.ports import free_port, port_is_free
from stack.processes import DirLock
from stack.settings import StackSettings

DATABASE_NAME = "modelforge"
KEY_FILE = OPERATOR_KEY_FILE
# Held while an `up` runs on the data dir: whoever holds it owns what the record names.
LOCK_FILE = "up.lock"
HEALTH_TIMEOUT_S = 90.0
# Longer than a worker's drain (Worker.stop waits up to 30 s for in-flight actors).
CHILD_STOP_TIMEOUT_S = 40.0
POLL_S = 0.2
# Query parameters of a database URL that hold a secret.
SECRET_PARAMETERS = frozenset({"password", "sslpassword"})


class StartupError(Exception):
    """A problem to report in one line, without a traceback."""


class _StopRequested(Exception):
    pass


@dataclass
class _Signals:
    """Turns SIGINT/SIGTERM into a flag that the startup steps and the supervisor poll.

    No exception is raised from the handler, so a signal can never land between starting a
    process and recording it, which would leave that process unsupervised.
    """

    requested: threading.Event = field(default_factory=threading.Event)
    signum: int | None = None

    def handle(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum
        self.requested.set()

    def check(self) -> None:
        if self.requested.is_set():
            raise _StopRequested

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        previous = {sig: signal.signal(sig, self.handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _say(message: str) -> None:
    print(message, flush=True)


def _warn(message: str) -> None:
    print(f"modelforge up: {message}", file=sys.stderr, flush=True)


def _redact(url: str) -> str:
    """url (or a NATS server list, comma-separated) with each secret in it shown as ***,
    for the banner and stack.json: a password, one given as a query parameter (libpq's
    and asyncpg's ?password=), and a NATS URL's lone user, which is its token."""
    return ",".join(_redact_one(part) for part in url.split(","))


def _redact_one(url: str) -> str:
    parts = urlsplit(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    if at:
        user, colon, _ = userinfo.partition(":")
        if colon:
            userinfo = f"{user}:***"
        elif parts.scheme in ("nats", "tls"):
            userinfo = "***"
    query = "&".join(
        f"{name}=***" if name.lower() in SECRET_PARAMETERS else f"{name}{eq}{value}"
        for name, eq, value in (item.partition("=") for item in parts.query.split("&") if item)
    )
    return urlunsplit(parts._replace(netloc=f"{userinfo}{at}{host}", query=query))


def _client_host(host: str) -> str:
    """Where a client on this machine reaches a server bound to host."""
    if host in ("", "0.0.0.0"):  # noqa: S104 - recognising the wildcard, not binding it
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


@dataclass(frozen=True)
class OperatorKey:
    value: str
    # The file it is kept in; None when it came from MODELFORGE_OPERATOR_API_KEY.
    path: Path | None
    # True on the run that generated it: the only run that shows it.
    created: bool


def operator_key(settings: StackSettings, data_dir: Path) -> OperatorKey:
    """The setting, else a key generated once and kept on disk (0600)."""
    if settings.operator_api_key is not None and settings.operator_api_key.get_secret_value():
        return OperatorKey(settings.operator_api_key.get_secret_value(), None, created=False)
    path = data_dir / KEY_FILE
    with contextlib.suppress(FileNotFoundError):
        key = path.read_text().strip()
        if key:
            path.chmod(0o600)
            return OperatorKey(key, path, created=False)
    key = secrets.token_urlsafe(32)
    # Written to a temporary name and renamed, so a crash never leaves a truncated key.
    tmp = path.with_name(f".{KEY_FILE}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    tmp.replace(path)
    return OperatorKey(key, path, created=True)


def _describe_key(key: OperatorKey) -> str:
    if key.path is None:
        return "from MODELFORGE_OPERATOR_API_KEY"
    if key.created:
        return f"{key.value}  (new; shown this once, kept in {key.path})"
    return f"in {key.path}"


def _reserve_port(host: str, port: int) -> socket.socket | None:
    """Hold the API port (bound, not listening) while the embedded servers pick theirs.

    Otherwise the kernel could hand the same number to one of them as a free port.
    Returns None when it cannot be held (e.g. TIME_WAIT leftovers), which is harmless.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        return None
    return sock


class _Stack:
    def __init__(self, settings: StackSettings, signals: _Signals) -> None:
        self.settings = settings
        self.signals = signals
        self.data_dir = settings.data_dir.expanduser().resolve()
        self.supervisor = Supervisor(RestartPolicy(), say=_warn)
        self.children: list[ChildProcess] = []
        self.record = ChildRecord(self.data_dir / RECORD_FILE)
        self.state_file = self.data_dir / SUPERVISOR_STATE_FILE
        self._failing: dict[str, str] = {}

    def run(self) -> int:
        host, port = self.settings.host, self.settings.port
        with contextlib.ExitStack() as cleanup:
            # First: a leftover of an earlier run may be what holds the port. A new data
            # dir has none, and is not created when the port is taken.
            existing = self.data_dir.exists()
            if existing:
                self._own_data_dir(cleanup)
            if not port_is_free(host, port):
                raise StartupError(
                    f"port {port} on {host} is already in use; stop whatever listens there "
                    "or choose another port with MODELFORGE_PORT"
                )
            reservation = _reserve_port(host, port)
            if reservation is not None:
                cleanup.callback(reservation.close)
            if not existing:
                self.data_dir.mkdir(parents=True, mode=0o700)
                self.data_dir.chmod(0o700)  # mkdir's mode is filtered by the umask
                self._own_data_dir(cleanup)
            database_url = self._database(cleanup)
            nats_url = self._nats(cleanup)
            self.signals.check()
            _say("applying database migrations")
            from store.migrate import upgrade

            upgrade(database_url)
            self.signals.check()
            key = operator_key(self.settings, self.data_dir)
            # Worker metrics are on, on a free port unless one is asked for; 0 turns them off.
            metrics_port = int(os.environ.get("MODELFORGE_METRICS_PORT") or free_port())
            # Before the API starts: it reads the file for /readyz.
            write_supervisor_state(self.state_file, SupervisorState(failing=[]))
            cleanup.callback(lambda: self.state_file.unlink(missing_ok=True))
            env = {
                **os.environ,
                "MODELFORGE_DATABASE_URL": database_url,
                "MODELFORGE_NATS_URL": nats_url,
                "MODELFORGE_OPERATOR_API_KEY": key.value,
                "MODELFORGE_HOST": host,
                "MODELFORGE_PORT": str(port),
                "PYTHONUNBUFFERED": "1",
                "MODELFORGE_METRICS_PORT": str(metrics_port),
                "MODELFORGE_ACCESS_LOG": "true" if self.settings.access_log else "false",
                SUPERVISOR_STATE_ENV: str(self.state_file),
            }
            # Registered before the children start so they stop before NATS and PostgreSQL.
            cleanup.callback(self._stop_children)
            if reservation is not None:
                reservation.close()
            # The worker carries the outbox relay and the liveness sweeps.
            for name in ("api", "worker"):
                argv = [sys.executable, "-m", "cli.main", name]
                if name == "api" and self.settings.api_processes is not None:
                    argv += ["--processes", str(self.settings.api_processes)]
                child = ChildProcess(
                    argv,
                    env,
                    stop_timeout_s=CHILD_STOP_TIMEOUT_S,
                    parent_death_signal=signal.SIGTERM,
                )
                child.start()
                self.children.append(child)
                # The worker can loop on an outage outside it (NATS); the API cannot be
                # done without.
                self.supervisor.add(f"modelforge {name}", child, essential=name == "api")
                self.record.track(f"modelforge {name}", child, signal.SIGTERM)
            base = f"http://{_client_host(host)}:{port}"
            self._wait_healthy(f"{base}/healthz")
            stack_file = write_stack_info(
                StackInfo(
                    api_url=base,
                    nats_url=nats_url,
                    operator_key_file=str(key.path) if key.path else None,
                    worker_metrics_url=(
                        f"http://127.0.0.1:{metrics_port}/metrics" if metrics_port else None
                    ),
                    data_dir=str(self.data_dir),
                    pid=os.getpid(),
                    database_url=_redact(database_url),
                    artifact_source_url=self.settings.artifact_source_url,
                )
            )
            cleanup.callback(lambda: stack_file.unlink(missing_ok=True))
            _say(self._banner(base, key, database_url, nats_url, metrics_port, stack_file))
            status = self._supervise()
        _say(f"stopped; data kept in {self.data_dir}")
        return status

    def _banner(
        self,
        base: str,
        key: OperatorKey,
        database_url: str,
        nats_url: str,
        metrics_port: int,
        stack_file: Path,
    ) -> str:
        worker_metrics = f"http://127.0.0.1:{metrics_port}/metrics" if metrics_port else "off"
        access_log = (
            "on (--access-log)"
            if self.settings.access_log
            else "off (--access-log turns it on; the traffic is on /metrics)"
        )
        return (
            "\nModelForge is up.\n"
            f"  API:          {base}\n"
            f"  Dashboard:    {base}/ui (sign in with the operator key)\n"
            f"  API docs:     {base}/docs\n"
            f"  Metrics:      {base}/metrics (API), {worker_metrics} (worker)\n"
            f"  Readiness:    {base}/readyz (names a child that keeps failing)\n"
            f"  Operator key: {_describe_key(key)}\n"
            f"  Database:     {_redact(database_url)}\n"
            f"  NATS:         {_redact(nats_url)}\n"
            f"  Models from:  {source_shown(self.settings.artifact_source_url)},"
            f" set by {SOURCE_URL_ENV}\n"
            f"  Access log:   {access_log}\n"
            f"  Data:         {self.data_dir}\n"
            f"  Clients:      {stack_file} (the URLs above and the model source; read by"
            " admin, events tail, simulate, ops/examples)\n"
            "Press Ctrl-C to stop; data is kept for the next run.\n"
        )

    def _own_data_dir(self, cleanup: contextlib.ExitStack) -> None:
        """Lock the data dir for this run, and stop what an earlier run left running."""
        lock = DirLock(self.data_dir / LOCK_FILE)
        try:
            lock.acquire()
        except RuntimeError:
            raise StartupError(
                f"another `modelforge up` is running on {self.data_dir}; stop it, or choose "
                "another data dir with MODELFORGE_DATA_DIR"
            ) from None
        cleanup.callback(lock.release)
        for leftover in stop_leftovers(self.record.path):
            _warn(f"stopped {leftover.name} (pid {leftover.pid}), left running by an earlier run")
        # Last out: everything recorded has been stopped by then.
        cleanup.callback(self.record.clear)

    def _database(self, cleanup: contextlib.ExitStack) -> str:
        if self.settings.database_url:
            _say(f"using PostgreSQL at {_redact(self.settings.database_url)}")
            return self.settings.database_url
        from stack.embedded_postgres import EmbeddedPostgres

        self.signals.check()
        pg = EmbeddedPostgres(self.data_dir / "postgres", die_with_parent=True)
        cleanup.callback(pg.stop)
        _say(f"starting PostgreSQL (data in {pg.pgdata}, log {pg.log_path})")
        pg.start()
        # SIGINT: a fast shutdown, which also ends its backends (stack/embedded_postgres.py).
        self.record.track("PostgreSQL", pg, signal.SIGINT)
        pg.ensure_database(DATABASE_NAME)
        # Essential: the API commits nothing without it, and restarting a database that
        # keeps crashing (a full disk, a damaged data dir) only hides the damage.
        self.supervisor.add("PostgreSQL", pg)
        return pg.url(DATABASE_NAME)

    def _nats(self, cleanup: contextlib.ExitStack) -> str:
        if self.settings.nats_url:
            _say(f"using NATS at {_redact(self.settings.nats_url)}")
            return self.settings.nats_url
        from stack.embedded_nats import EmbeddedNats

        self.signals.check()
        nats = EmbeddedNats(self.data_dir / "nats", die_with_parent=True)
        cleanup.callback(nats.stop)
        _say(f"starting NATS JetStream (store in {nats.store_dir}, log {nats.log_path})")
        nats.start()
        self.record.track("nats-server", nats, signal.SIGTERM)
        # Its loop leaves the API serving: changes wait in the outbox.
        self.supervisor.add("nats-server", nats, essential=False)
        return nats.url

    def _wait_healthy(self, url: str) -> None:
        deadline = time.monotonic() + HEALTH_TIMEOUT_S
        api = self.children[0]
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            while time.monotonic() < deadline:
                self.signals.check()
                # Only the API: a worker that dies this early is the supervisor's to
                # restart, as later on (it waits for NATS rather than dying of it).
                status = api.exit_status()
                if status is not None:
                    raise StartupError(
                        f"`modelforge api` exited with status {status} during startup"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(url).status_code == 200:
                        return
                time.sleep(POLL_S)
        raise StartupError(f"the API did not answer {url} within {HEALTH_TIMEOUT_S:.0f}s")

    def _supervise(self) -> int:
        while not self.signals.requested.wait(POLL_S):
            try:
                self.supervisor.poll()
                # A restarted child has a new pid.
                self.record.refresh()
            except CrashLoop as exc:
                _warn(f"{exc}; stopping everything")
                return 1
            self._publish_failing()
        _say("stopping")
        return 0

    def _publish_failing(self) -> None:
        """Tell the API (its /readyz) and the operator when the failing set changed."""
        failing = self.supervisor.failing()
        if failing == self._failing:
            return
        newly = sorted(set(failing) - set(self._failing))
        self._failing = failing
        children = [FailingChild(name=name, reason=why) for name, why in failing.items()]
        write_supervisor_state(self.state_file, SupervisorState(failing=children))
        if newly:
            _warn(f"the API keeps serving; /readyz names {', '.join(newly)} until it recovers")

    def _stop_children(self) -> None:
        # Reverse start order: the worker (and its relay) stops before the API goes away.
        for child in reversed(self.children):
            child.stop()


def run_up(settings: StackSettings) -> int:
    """Run the local stack in the foreground; the process exit status."""
    signals = _Signals()
    with signals.installed():
        try:
            return _Stack(settings, signals).run()
        except _StopRequested:
            _say("stopped")
            return 0
        except StartupError as exc:
            print(f"modelforge up: {exc}", file=sys.stderr, flush=True)
            return 1
        except Exception:
            traceback.print_exc()
            print("modelforge up: failed; everything it started was stopped", file=sys.stderr)
            return 1
