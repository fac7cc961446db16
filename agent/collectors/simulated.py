"""Simulated GPUs for development, tests and demos.

UUIDs derive from a seed (by default the node id), so they are stable across restarts
and distinct between nodes. Telemetry changes plausibly: a bounded random walk per GPU.
"""

from __future__ import annotations

import random
import uuid

from agent.collectors.base import GpuCollection
from schemas.agent import GpuInventory, GpuTelemetry

_NAMESPACE = uuid.UUID("6f1c2b9e-1f0a-4c55-9a43-2f6f5c3b7d10")
MEMORY_BYTES = 141 * 2**30


def simulated_gpu_uuid(seed: str, index: int) -> str:
    return f"GPU-{uuid.uuid5(_NAMESPACE, f'{seed}/{index}')}"


class SimulatedCollector:
    name = "simulated"

    def __init__(self, seed: str, gpus: int = 2) -> None:
        self.seed = seed
        self.count = gpus
        self._random = random.Random(seed)
        self._utilization = [self._random.uniform(10, 60) for _ in range(gpus)]

    def inventory(self) -> GpuCollection:
        return GpuCollection(
            gpus=[
                GpuInventory(
                    uuid=simulated_gpu_uuid(self.seed, index),
                    index=index,
                    name="NVIDIA H200 (simulated)",
                    pci_bus_id=f"00000000:{index + 0x18:02X}:00.0",
                    memory_total_bytes=MEMORY_BYTES,
                    driver_version="570.86.15",
                    cuda_version="12.8",
                )
                for index in range(self.count)
            ],
            complete=True,
        )

    def telemetry(self) -> list[GpuTelemetry]:
        samples = []
        for index in range(self.count):
            walked = self._utilization[index] + self._random.uniform(-15, 15)
            utilization = min(100.0, max(0.0, walked))
            self._utilization[index] = utilization
            samples.append(
                GpuTelemetry(
                    uuid=simulated_gpu_uuid(self.seed, index),
                    utilization_percent=round(utilization, 1),
                    memory_used_bytes=int(MEMORY_BYTES * (0.05 + 0.9 * utilization / 100)),
                    temperature_c=round(32 + 0.5 * utilization + self._random.uniform(-2, 2), 1),
                    power_w=round(75 + 6 * utilization + self._random.uniform(-10, 10), 1),
                )
            )
        return samples

    def close(self) -> None:
        return None
