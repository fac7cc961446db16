"""The host's CPU as one device. A server on it sees no GPU, even from a CUDA build."""

from __future__ import annotations

import psutil

from agent.runtime.backends.base import DeviceMetrics, DeviceRef


class CpuBackend:
    name = "cpu"

    def devices(self) -> list[DeviceRef]:
        total = psutil.virtual_memory().total
        return [DeviceRef(id="cpu", backend="cpu", name="cpu", memory_total_bytes=total)]

    def metrics(self, device: DeviceRef) -> DeviceMetrics:
        memory = psutil.virtual_memory()
        return DeviceMetrics(memory_total_bytes=memory.total, memory_free_bytes=memory.available)

    def environment(self, device: DeviceRef) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": ""}

    def close(self) -> None:
        return None
