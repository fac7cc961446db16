"""The cuda backend for real: ops/gpu_runtime_check.py builds llama-server with CUDA,
loads the model on every GPU with NVML metrics and probes it. Where there is no NVIDIA
driver, the same script must say so plainly and exit 2 (that is checked instead)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.agent.harness import REPO, clean_env, nvml_driver_problem


def run_check(timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "ops/gpu_runtime_check.py"],
        cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=timeout_s,
        check=False,
    )  # fmt: skip


@pytest.mark.skipif(nvml_driver_problem() is None, reason="NVML works here: see the gpu test")
def test_without_a_gpu_the_check_says_so_and_exits_2() -> None:
    result = run_check(60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "no NVIDIA GPU to check here" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.gpu
@pytest.mark.timeout(3600)
def test_the_cuda_backend_loads_probes_and_settles_on_every_gpu() -> None:
    problem = nvml_driver_problem()
    if problem is not None:
        pytest.skip(f"no NVIDIA driver on this machine: {problem}")
    result = run_check(3500)  # the first CUDA build takes many minutes
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    devices = json.loads(result.stdout)
    assert devices
    for device in devices:
        assert device["uuid"] and device["memory_total_bytes"] > 0
        assert device["vram_used_while_loaded_bytes"] > 0
        assert device["answer"] and device["settle_s"] is not None
