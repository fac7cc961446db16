"""Collectors: simulated GPUs, host facts, and NVML (a fake NVML library for the logic, the
real one for "unavailable here" and, with @gpu, for real GPUs)."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from agent.collectors.base import NoGpus
from agent.collectors.host import LocalHost, host_facts, host_telemetry
from agent.collectors.nvml import NvmlCollector, cuda_version_text
from agent.collectors.simulated import SimulatedCollector
from schemas.agent import GpuInventory
from tests.agent.harness import REPO, clean_env, nvml_driver_problem


class FakeError(Exception):
    pass


def fake_nvml(
    gpus: int = 2, *, init_fails: bool = False, broken: set[int] | None = None
) -> types.ModuleType:
    """Just enough of pynvml's surface, with the values a real H200 reports."""
    nvml = types.ModuleType("fake_pynvml")
    state = {"init_fails": init_fails, "inits": 0, "shutdowns": 0}
    broken = broken or set()

    def init() -> None:
        if state["init_fails"]:
            raise FakeError("Driver Not Loaded")
        state["inits"] += 1

    def check(index: int) -> None:
        if index in broken:
            raise FakeError("GPU is lost")

    def handle(index: int) -> int:
        check(index)
        return index

    nvml.__dict__.update(
        NVMLError=FakeError,
        NVML_TEMPERATURE_GPU=0,
        state=state,
        nvmlInit=init,
        nvmlShutdown=lambda: state.__setitem__("shutdowns", state["shutdowns"] + 1),
        nvmlDeviceGetCount=lambda: gpus,
        nvmlSystemGetDriverVersion=lambda: "570.86.15",
        nvmlSystemGetCudaDriverVersion_v2=lambda: 12080,
        nvmlDeviceGetHandleByIndex=handle,
        nvmlDeviceGetUUID=lambda h: f"GPU-0000000{h}-aaaa-bbbb-cccc-dddddddddddd",
        nvmlDeviceGetName=lambda h: b"NVIDIA H200",
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId=f"00000000:{h + 0x18:02X}:00.0"),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=150754820096, used=2**30),
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=37),
        nvmlDeviceGetTemperature=lambda h, sensor: 41,
        nvmlDeviceGetPowerUsage=lambda h: 123456,
    )
    return nvml


@pytest.mark.fast
def test_nvml_inventory_and_telemetry() -> None:
    nvml = fake_nvml()
    collector = NvmlCollector(nvml)
    inventory = collector.inventory()
    assert inventory.complete and inventory.problem is None
    assert [g.index for g in inventory.gpus] == [0, 1]
    first = inventory.gpus[0]
    assert first.name == "NVIDIA H200" and first.pci_bus_id == "00000000:18:00.0"
    assert (first.driver_version, first.cuda_version) == ("570.86.15", "12.8")
    assert first.memory_total_bytes == 150754820096
    sample = collector.telemetry()[1]
    assert sample.uuid == inventory.gpus[1].uuid
    assert (sample.utilization_percent, sample.temperature_c) == (37.0, 41.0)
    assert sample.power_w == pytest.approx(123.456) and sample.memory_used_bytes == 2**30
    collector.close()
    assert nvml.state["shutdowns"] == 1


@pytest.mark.fast
def test_nvml_unavailable_is_incomplete_never_empty_and_recovers() -> None:
    nvml = fake_nvml(init_fails=True)
    collector = NvmlCollector(nvml)
    inventory = collector.inventory()
    assert not inventory.complete and inventory.gpus == []
    assert inventory.problem == "NVML unavailable: Driver Not Loaded"
    assert collector.telemetry() == []
    nvml.state["init_fails"] = False  # the driver came up later
    assert collector.inventory().complete and len(collector.inventory().gpus) == 2


@pytest.mark.fast
def test_a_failing_gpu_makes_the_inventory_incomplete_but_keeps_the_others() -> None:
    collector = NvmlCollector(fake_nvml(3, broken={1}))
    inventory = collector.inventory()
    assert not inventory.complete
    assert [g.index for g in inventory.gpus] == [0, 2]
    assert inventory.problem is not None and "GPU 1: GPU is lost" in inventory.problem
    assert len(collector.telemetry()) == 2


@pytest.mark.fast
def test_broken_sensor_readings_are_left_out() -> None:
    nvml = fake_nvml(1)
    nvml.nvmlDeviceGetTemperature = lambda h, sensor: 9999  # type: ignore[attr-defined]

    def no_power(handle: Any) -> int:
        raise FakeError("Not Supported")

    nvml.nvmlDeviceGetPowerUsage = no_power  # type: ignore[attr-defined]
    sample = NvmlCollector(nvml).telemetry()[0]
    assert sample.temperature_c is None and sample.power_w is None
    assert sample.utilization_percent == 37.0


@pytest.mark.fast
def test_cuda_version_text() -> None:
    assert cuda_version_text(12080) == "12.8"
    assert cuda_version_text(11040) == "11.4"


@pytest.mark.skipif(nvml_driver_problem() is None, reason="NVML works here: see the gpu test")
def test_real_nvml_without_a_driver_reports_incomplete_and_the_check_exits_2() -> None:
    inventory = NvmlCollector().inventory()
    assert not inventory.complete and inventory.gpus == []
    assert inventory.problem is not None and inventory.problem.startswith("NVML unavailable: ")
    result = subprocess.run(
        [sys.executable, "ops/gpu_check.py"],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "NVML unavailable: " in result.stderr
    report = json.loads(result.stdout)
    assert report["complete"] is False and report["gpus"] == []
    assert report["host"]["cpu_count"] >= 1


@pytest.mark.gpu
def test_real_gpus_are_found_through_nvml() -> None:
    """Skipped only where NVML reports that there is no driver (library or kernel
    module missing): on a GPU host any other NVML failure fails this test."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError_DriverNotLoaded) as exc:
        pytest.skip(f"no NVIDIA driver on this machine: {exc}")
    pynvml.nvmlShutdown()
    result = subprocess.run(
        [sys.executable, "ops/gpu_check.py"],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["complete"] is True and report["gpus"], report
    for gpu in report["gpus"]:
        GpuInventory.model_validate(gpu)
        assert gpu["uuid"].startswith(("GPU-", "MIG-")) and gpu["memory_total_bytes"] > 0
        assert gpu["driver_version"] and gpu["cuda_version"]
    samples = report["telemetry"]["gpus"]
    assert {s["uuid"] for s in samples} == {g["uuid"] for g in report["gpus"]}
    assert all(s["memory_used_bytes"] is not None for s in samples)


@pytest.mark.fast
def test_simulated_gpus_are_stable_per_seed_and_telemetry_moves() -> None:
    first = SimulatedCollector("node-a", 4).inventory()
    again = SimulatedCollector("node-a", 4).inventory()
    other = SimulatedCollector("node-b", 4).inventory()
    assert first.complete and [g.uuid for g in first.gpus] == [g.uuid for g in again.gpus]
    assert not {g.uuid for g in first.gpus} & {g.uuid for g in other.gpus}
    collector = SimulatedCollector("node-a", 2)
    samples = [collector.telemetry() for _ in range(20)]
    utilizations = {s[0].utilization_percent for s in samples}
    assert len(utilizations) > 5  # it changes
    for sample in (s for batch in samples for s in batch):
        assert sample.utilization_percent is not None and 0 <= sample.utilization_percent <= 100
        assert sample.temperature_c is not None and 20 < sample.temperature_c < 100
        assert sample.power_w is not None and 50 < sample.power_w < 800


@pytest.mark.fast
def test_host_facts_and_telemetry(tmp_path: Path) -> None:
    facts = host_facts("configured-name", [str(tmp_path), str(tmp_path), "/no/such/path"])
    assert facts.hostname == "configured-name"
    assert facts.cpu_count >= 1 and facts.ram_total_bytes > 0 and facts.kernel
    assert facts.storage_total_bytes > 0
    assert host_facts().hostname  # from the system when not configured
    telemetry = host_telemetry([str(tmp_path), "/no/such/path"])
    assert 0 < telemetry.ram_used_bytes <= telemetry.ram_total_bytes
    assert [s.path for s in telemetry.storage] == [str(tmp_path)]
    host = LocalHost(None, ["/"])
    assert host.facts().hostname and host.telemetry().storage


@pytest.mark.fast
def test_a_host_declared_without_gpus_is_complete() -> None:
    collection = NoGpus().inventory()
    assert collection.complete and collection.gpus == []
