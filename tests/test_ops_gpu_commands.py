"""`modelforge gpu-check` and `modelforge gpu-runtime-check`: the checkout's GPU check
scripts (ops/) run by the install's own interpreter, from any working directory, so
the README's GPU checks never end in a ModuleNotFoundError of a bare system Python."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent.harness import clean_env, nvml_driver_problem

pytestmark = pytest.mark.fast

# The console script of this install, as `./modelforge` execs it.
MODELFORGE = Path(sys.executable).parent / "modelforge"


def run(command: str, cwd: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(MODELFORGE), command],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def test_gpu_check_reports_what_nvml_says(tmp_path: Path) -> None:
    result = run("gpu-check", tmp_path, 120)
    report = json.loads(result.stdout)
    assert report["host"]["cpu_count"] >= 1
    if nvml_driver_problem() is None:
        assert result.returncode == 0, result.stderr
        assert report["complete"] is True and report["gpus"]
    else:
        assert result.returncode == 2, result.stderr
        assert "NVML unavailable: " in result.stderr
        assert report["complete"] is False and report["gpus"] == []
    assert "Traceback" not in result.stderr


@pytest.mark.skipif(
    nvml_driver_problem() is None,
    reason="NVML works here: the command would build llama-server with CUDA (the gpu"
    " tests in tests/runtime/test_gpu_runtime.py run the same script)",
)
def test_gpu_runtime_check_without_a_gpu_says_so_and_exits_2(tmp_path: Path) -> None:
    result = run("gpu-runtime-check", tmp_path, 120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "no NVIDIA GPU to check here" in result.stderr
    assert "Traceback" not in result.stderr
