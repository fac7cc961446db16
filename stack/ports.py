"""TCP port helpers for the embedded servers and `modelforge up`."""

from __future__ import annotations

import random
import socket
import time
from pathlib import Path

# Well-known ports of system services that may run beside us (PostgreSQL, NATS client,
# monitoring and cluster). A free-port pick never returns one, so that an embedded server
# cannot be mistaken for the machine's own server by a client using defaults.
RESERVED_PORTS = frozenset({4222, 5432, 6222, 8080, 8222})
# Random picks start here, above the ports that system services commonly use.
_LOWEST = 20000


def port_is_free(host: str, port: int) -> bool:
    """True if a listener could bind host:port now.

    SO_REUSEADDR mirrors what the servers themselves set, so sockets in TIME_WAIT left by a
    previous run do not count as busy, while a live listener still does.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free right now; the caller must tolerate losing a race for it.

    Preferably below the ephemeral range: the kernel never hands such a port to an
    outgoing connection or to another bind(port=0), so a server stopped for a while (an
    outage test) gets its port back.
    """
    low, _ = _ephemeral_range()
    if low > _LOWEST + 1000:
        for _ in range(100):
            port = random.randrange(_LOWEST, low)
            if port not in RESERVED_PORTS and port_is_free(host, port):
                return port
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in RESERVED_PORTS:
            return port
    raise RuntimeError(f"no free TCP port found on {host}")


def remembered_port(path: Path, host: str = "127.0.0.1") -> int | None:
    """The port recorded at `path` by an earlier run, if it is still free."""
    try:
        port = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    if not 0 < port < 65536 or port in RESERVED_PORTS or not port_is_free(host, port):
        return None
    return port


def remember_port(path: Path, port: int) -> None:
    path.write_text(f"{port}\n")


def wait_for_tcp(host: str, port: int, timeout_s: float) -> bool:
    """Poll until something accepts on host:port; False on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return True
        except OSError:
            time.sleep(0.05)
    return False
