"""The collector protocol: one GPU source the publishing loops can rely on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from schemas.agent import GpuInventory, GpuTelemetry


@dataclass(frozen=True)
class GpuCollection:
    """One look at the GPUs.

    complete=False means the collector could not see everything (NVML unavailable or
    failing): the GPUs listed are certain, absent ones are unknown, never "vanished".
    """

    gpus: list[GpuInventory] = field(default_factory=list)
    complete: bool = True
    # Why it is incomplete, in a few words (for the log and the GPU check).
    problem: str | None = None


class GpuCollector(Protocol):
    name: str

    def inventory(self) -> GpuCollection: ...

    def telemetry(self) -> list[GpuTelemetry]: ...

    def close(self) -> None: ...


class NoGpus:
    """A host without GPUs, declared by configuration (collector: none)."""

    name = "none"

    def inventory(self) -> GpuCollection:
        return GpuCollection(gpus=[], complete=True)

    def telemetry(self) -> list[GpuTelemetry]:
        return []

    def close(self) -> None:
        return None
