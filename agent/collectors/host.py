"""Host facts and host telemetry (psutil and the standard library)."""

from __future__ import annotations

import contextlib
import os
import platform
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import psutil

from schemas.agent import HostFacts, StorageTelemetry

_MAX = 255


def _clip(text: str, limit: int = _MAX) -> str:
    return text.strip()[:limit]


def _os_name() -> str:
    with contextlib.suppress(OSError):
        release = platform.freedesktop_os_release()
        if release.get("PRETTY_NAME"):
            return release["PRETTY_NAME"]
    return f"{platform.system()} {platform.version()}".strip()


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                return value.strip()
    return platform.processor() or platform.machine()


def reported_hostname(configured: str | None = None) -> str:
    """A fact about the host, never its identity (that lives in the state dir)."""
    return _clip(configured or socket.gethostname() or "unknown") or "unknown"


class Usage(NamedTuple):
    total: int
    used: int


def _volumes(paths: Sequence[str]) -> list[tuple[str, Usage]]:
    """(path, usage) per path, one per filesystem, skipping paths that do not exist."""
    seen: set[int] = set()
    found = []
    for path in paths:
        try:
            device = os.stat(path).st_dev
            disk = psutil.disk_usage(path)
        except OSError:
            continue
        if device not in seen:
            seen.add(device)
            found.append((path, Usage(disk.total, disk.used)))
    return found


def host_facts(
    hostname: str | None = None,
    storage_paths: Sequence[str] = ("/",),
    artifact_roots: Sequence[str] = (),
) -> HostFacts:
    return HostFacts(
        hostname=reported_hostname(hostname),
        os=_clip(_os_name()),
        kernel=_clip(platform.release()),
        cpu_model=_clip(_cpu_model()),
        cpu_count=min(os.cpu_count() or 0, 65536),
        ram_total_bytes=psutil.virtual_memory().total,
        storage_total_bytes=sum(usage.total for _, usage in _volumes(storage_paths)),
        artifact_roots=list(artifact_roots),
    )


@dataclass(frozen=True)
class HostTelemetry:
    ram_total_bytes: int
    ram_used_bytes: int
    storage: list[StorageTelemetry]


def host_telemetry(storage_paths: Sequence[str] = ("/",)) -> HostTelemetry:
    memory = psutil.virtual_memory()
    return HostTelemetry(
        ram_total_bytes=memory.total,
        ram_used_bytes=min(memory.total - memory.available, memory.total),
        storage=[
            StorageTelemetry(path=path[:1024], total_bytes=usage.total, used_bytes=usage.used)
            for path, usage in _volumes(storage_paths)
        ],
    )


class LocalHost:
    """This machine, as the agent reports it."""

    def __init__(
        self,
        hostname: str | None = None,
        storage_paths: Sequence[str] = ("/",),
        artifact_roots: Sequence[str] = (),
    ):
        self.hostname = hostname
        self.storage_paths = tuple(storage_paths)
        self.artifact_roots = tuple(artifact_roots)

    def facts(self) -> HostFacts:
        return host_facts(self.hostname, self.storage_paths, self.artifact_roots)

    def telemetry(self) -> HostTelemetry:
        return host_telemetry(self.storage_paths)
