"""What every backend provides."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class UnsupportedBackend(Exception):
    """A backend this build cannot drive, or one whose devices cannot be found."""


@dataclass(frozen=True)
class DeviceRef:
    # "cpu", or "gpu:<index>" (the index is NVML's, in PCI bus order).
    id: str
    backend: str
    uuid: str | None = None
    name: str = ""
    memory_total_bytes: int | None = None


@dataclass(frozen=True)
class DeviceMetrics:
    memory_total_bytes: int | None = None
    memory_free_bytes: int | None = None
    utilization_percent: float | None = None


class RuntimeBackend(Protocol):
    name: str

    def devices(self) -> list[DeviceRef]: ...

    def metrics(self, device: DeviceRef) -> DeviceMetrics: ...

    def environment(self, device: DeviceRef) -> dict[str, str]:
        """Variables that pin a server to this device (and to no other)."""
        ...

    def close(self) -> None: ...
