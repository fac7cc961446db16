"""GPUs through NVML (`pynvml`, package nvidia-ml-py).

NVML is initialised lazily and again after a failure, so a driver that comes up after the
agent (or is reloaded) is picked up. When NVML is unavailable or a call fails, the
inventory says complete=False with the reason: the control plane then keeps last-good
state instead of marking GPUs missing. Telemetry fields that fail are left out (None).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

from agent.collectors.base import GpuCollection
from schemas.agent import GpuInventory, GpuTelemetry

logger = logging.getLogger("modelforge.agent.nvml")
T = TypeVar("T")


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def cuda_version_text(version: int) -> str:
    """NVML's integer CUDA driver version (e.g. 12080) as "12.8"."""
    return f"{version // 1000}.{(version % 1000) // 10}"


def _load() -> ModuleType:
    import pynvml

    module: ModuleType = pynvml
    return module


class NvmlUnavailable(Exception):
    pass


class NvmlCollector:
    name = "nvml"

    def __init__(self, nvml: ModuleType | None = None) -> None:
        self._nvml = nvml
        self._initialised = False
        # The loops collect from worker threads; init/shutdown must not interleave.
        self._lock = threading.RLock()

    def _module(self) -> ModuleType:
        if self._nvml is None:
            try:
                self._nvml = _load()
            except ImportError as exc:
                raise NvmlUnavailable(f"pynvml is not installed ({exc})") from None
        return self._nvml

    def _ensure(self) -> ModuleType:
        nvml = self._module()
        if not self._initialised:
            try:
                nvml.nvmlInit()
            except nvml.NVMLError as exc:
                raise NvmlUnavailable(_text(exc) or type(exc).__name__) from None
            except OSError as exc:
                raise NvmlUnavailable(f"cannot load the NVML library: {exc}") from None
            self._initialised = True
        return nvml

    def _reset(self) -> None:
        """After a failure: shut down, so the next collection initialises afresh."""
        if self._initialised and self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
        self._initialised = False

    def _optional(self, call: Callable[[], T]) -> T | None:
        assert self._nvml is not None
        try:
            return call()
        except self._nvml.NVMLError:
            return None

    def inventory(self) -> GpuCollection:
        with self._lock:
            return self._inventory()

    def _inventory(self) -> GpuCollection:
        try:
            nvml = self._ensure()
        except NvmlUnavailable as exc:
            return GpuCollection(complete=False, problem=f"NVML unavailable: {exc}")
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            self._reset()
            return GpuCollection(complete=False, problem=f"NVML failing: {_text(exc)}")
        driver = self._optional(lambda: _text(nvml.nvmlSystemGetDriverVersion()))
        cuda_raw = self._optional(lambda: int(nvml.nvmlSystemGetCudaDriverVersion_v2()))
        cuda = cuda_version_text(cuda_raw) if cuda_raw else None
        gpus: list[GpuInventory] = []
        problems: list[str] = []
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                pci = nvml.nvmlDeviceGetPciInfo(handle)
                gpus.append(
                    GpuInventory(
                        uuid=_text(nvml.nvmlDeviceGetUUID(handle))[:128],
                        index=index,
                        name=_text(nvml.nvmlDeviceGetName(handle))[:200] or "unknown",
                        pci_bus_id=_text(pci.busId)[:64] or "unknown",
                        memory_total_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
                        driver_version=driver[:64] if driver else None,
                        cuda_version=cuda,
                    )
                )
            except nvml.NVMLError as exc:
                problems.append(f"GPU {index}: {_text(exc)}")
        if problems:
            return GpuCollection(
                gpus=gpus, complete=False, problem="NVML failing: " + "; ".join(problems)
            )
        return GpuCollection(gpus=gpus, complete=True)

    def telemetry(self) -> list[GpuTelemetry]:
        with self._lock:
            return self._telemetry()

    def _telemetry(self) -> list[GpuTelemetry]:
        try:
            nvml = self._ensure()
            count = int(nvml.nvmlDeviceGetCount())
        except NvmlUnavailable:
            return []
        except Exception:
            self._reset()
            return []
        samples = []
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                gpu_uuid = _text(nvml.nvmlDeviceGetUUID(handle))[:128]
            except nvml.NVMLError:
                continue
            samples.append(self._sample(nvml, handle, gpu_uuid))
        return samples

    def _sample(self, nvml: ModuleType, handle: Any, gpu_uuid: str) -> GpuTelemetry:
        utilization = self._optional(lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        memory = self._optional(lambda: nvml.nvmlDeviceGetMemoryInfo(handle).used)
        temperature = self._optional(
            lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
        )
        power_mw = self._optional(lambda: nvml.nvmlDeviceGetPowerUsage(handle))
        return GpuTelemetry(
            uuid=gpu_uuid,
            utilization_percent=_bounded(utilization, 0, 100),
            memory_used_bytes=int(memory) if memory is not None else None,
            temperature_c=_bounded(temperature, -100, 250),
            power_w=_bounded(power_mw / 1000 if power_mw is not None else None, 0, 1e4),
        )

    def close(self) -> None:
        with self._lock:
            self._reset()


def _bounded(value: float | int | None, low: float, high: float) -> float | None:
    """A reading outside the wire limits is a broken sensor: report nothing."""
    if value is None:
        return None
    number = float(value)
    return number if low <= number <= high else None
