"""The systemd units (ops/systemd/) are valid, hardened, and start real subcommands.

`systemd-analyze verify` also checks that ExecStart's binary exists, which on a CI box
(/opt/modelforge is the operator's install path) it never does: each unit is verified
from a copy whose ExecStart names a stub executable with the same arguments, and any
diagnostic at all fails the test (verify exits 0 on an unknown or misplaced key, so the
exit status alone would let a typo pass). What ExecStart runs is checked separately:
its arguments must parse as a `modelforge` command line.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from cli.main import build_parser

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parent.parent
UNITS = sorted((REPO / "ops" / "systemd").glob("*.service"))
BINARY = "/opt/modelforge/venv/bin/modelforge"
# systemd-analyze security's score, times ten: "OK" ends at 3.9; these units are ~2.
EXPOSURE_MAX = "25"
HARDENING = {
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "RestrictSUIDSGID": "yes",
    "CapabilityBoundingSet": "",
    "UMask": "0077",
}
# Where each unit may write besides its StateDirectory: nowhere, but for the agent's
# artifact roots.
WRITABLE = {
    "modelforge-api.service": set(),
    "modelforge-worker.service": set(),
    "modelforge-agent.service": {"-/srv/modelforge"},
    "modelforge-runtime.service": set(),
}
# NVML and CUDA open /dev/nvidia*: a private /dev would hide every GPU.
NEEDS_GPUS = {"modelforge-agent.service", "modelforge-runtime.service"}


def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        message = "systemd-analyze is missing (Debian: apt-get install systemd; .ci/run does)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found


def service(unit: Path) -> dict[str, list[str]]:
    """[Service] as key -> every value given (systemd allows repeated keys)."""
    values: dict[str, list[str]] = {}
    section = ""
    for line in unit.read_text().splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
        elif section == "Service" and line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values.setdefault(key, []).append(value)
    return values


def stubbed(unit: Path, tmp_path: Path) -> Path:
    stub = tmp_path / "modelforge"
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    copy = tmp_path / unit.name
    text = unit.read_text()
    assert BINARY in text, f"{unit.name}: ExecStart is not {BINARY}"
    copy.write_text(text.replace(BINARY, str(stub)))
    return copy


def test_there_is_a_unit_for_every_long_running_command() -> None:
    assert {unit.name for unit in UNITS} == set(WRITABLE)


@pytest.mark.parametrize("unit", UNITS, ids=lambda unit: unit.name)
def test_systemd_analyze_verify_says_nothing(unit: Path, tmp_path: Path) -> None:
    result = subprocess.run(
        [systemd_analyze(), "verify", "--man=no", str(stubbed(unit, tmp_path))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), (
        result.stdout + result.stderr
    )


@pytest.mark.parametrize("unit", UNITS, ids=lambda unit: unit.name)
def test_the_exposure_stays_low(unit: Path, tmp_path: Path) -> None:
    result = subprocess.run(
        [
            systemd_analyze(),
            "security",
            "--offline=yes",
            f"--threshold={EXPOSURE_MAX}",
            "--no-pager",
            str(stubbed(unit, tmp_path)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr


@pytest.mark.parametrize("unit", UNITS, ids=lambda unit: unit.name)
def test_hardening_and_where_it_may_write(unit: Path) -> None:
    values = service(unit)
    for key, wanted in HARDENING.items():
        assert values.get(key) == [wanted], f"{unit.name}: {key}={values.get(key)}"
    assert set(values.get("ReadWritePaths", [])) == WRITABLE[unit.name]
    for directory in values.get("StateDirectory", []):
        assert directory.startswith("modelforge-"), directory
    if unit.name in NEEDS_GPUS:
        assert "PrivateDevices" not in values, f"{unit.name}: would hide /dev/nvidia*"
    else:
        assert values.get("PrivateDevices") == ["yes"], unit.name


@pytest.mark.parametrize("unit", UNITS, ids=lambda unit: unit.name)
def test_exec_start_is_a_real_modelforge_command(unit: Path) -> None:
    (exec_start,) = service(unit)["ExecStart"]
    binary, *args = shlex.split(exec_start)
    assert binary == BINARY
    # argparse exits 2 on anything it does not know.
    parsed = build_parser().parse_args(args)
    assert parsed.command == unit.name.removeprefix("modelforge-").removesuffix(".service")
