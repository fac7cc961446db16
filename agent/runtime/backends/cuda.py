"""NVIDIA GPUs through NVML (the agent's own collector, agent/collectors/nvml.py).

A server is pinned by GPU UUID with CUDA_DEVICE_ORDER=PCI_BUS_ID: indexes can differ
between NVML and the CUDA runtime, a UUID cannot."""

from __future__ import annotations

from agent.collectors.nvml import NvmlCollector
from agent.runtime.backends.base import DeviceMetrics, DeviceRef, UnsupportedBackend


class CudaBackend:
    name = "cuda"

    def __init__(self, nvml: NvmlCollector | None = None) -> None:
        self._nvml = nvml or NvmlCollector()

    def devices(self) -> list[DeviceRef]:
        found = self._nvml.inventory()
        if not found.complete:
            raise UnsupportedBackend(f"cuda: {found.problem}")
        return [
            DeviceRef(
                id=f"gpu:{gpu.index}",
                backend="cuda",
                uuid=gpu.uuid,
                name=gpu.name,
                memory_total_bytes=gpu.memory_total_bytes,
            )
            for gpu in found.gpus
        ]

    def metrics(self, device: DeviceRef) -> DeviceMetrics:
        sample = next((t for t in self._nvml.telemetry() if t.uuid == device.uuid), None)
        total = device.memory_total_bytes
        if sample is None or sample.memory_used_bytes is None or total is None:
            return DeviceMetrics(memory_total_bytes=total)
        return DeviceMetrics(
            memory_total_bytes=total,
            memory_free_bytes=max(0, total - sample.memory_used_bytes),
            utilization_percent=sample.utilization_percent,
        )

    def environment(self, device: DeviceRef) -> dict[str, str]:
        assert device.uuid is not None
        return {"CUDA_VISIBLE_DEVICES": device.uuid, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}

    def close(self) -> None:
        self._nvml.close()
