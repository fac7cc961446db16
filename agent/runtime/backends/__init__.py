"""Runtime backends: which devices a node has, how a server is pinned to one, and what
each has free. Scheduling stays backend-agnostic on DeviceRef and DeviceMetrics."""

from __future__ import annotations

from agent.runtime.backends.base import (
    DeviceMetrics,
    DeviceRef,
    RuntimeBackend,
    UnsupportedBackend,
)
from agent.runtime.backends.cpu import CpuBackend
from agent.runtime.backends.cuda import CudaBackend

SUPPORTED = ("cpu", "cuda")


def backend(name: str) -> RuntimeBackend:
    """The backend of that name; metal, rocm, sycl and vulkan are refused plainly."""
    if name == "cpu":
        return CpuBackend()
    if name == "cuda":
        return CudaBackend()
    raise UnsupportedBackend(
        f"backend {name!r} is not supported by this build (supported: {', '.join(SUPPORTED)})"
    )


__all__ = ["DeviceMetrics", "DeviceRef", "RuntimeBackend", "UnsupportedBackend", "backend"]
