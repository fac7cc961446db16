"""What an operator can fix is one line on stderr and a status, never a traceback; and
the tools find `modelforge up` through its stack file, never through a default port."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from schemas.stack import StackFileError, StackInfo, read_stack_info, write_stack_info
from tests.agent.harness import REPO, clean_env


def modelforge(*argv: str, timeout_s: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *argv],
        cwd=REPO,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def info(directory: Path, pid: int, nats_url: str = "nats://127.0.0.1:9") -> StackInfo:
    return StackInfo(
        api_url="http://127.0.0.1:9",
        nats_url=nats_url,
        operator_key_file=None,
        data_dir=str(directory),
        pid=pid,
    )


def test_missing_settings_are_named(tmp_path: Path) -> None:
    result = modelforge("api")
    assert result.returncode == 2
    assert one_line(result) == (
        "modelforge api: MODELFORGE_DATABASE_URL is required; MODELFORGE_NATS_URL is required"
    )
    result = modelforge("worker", MODELFORGE_DATABASE_URL="postgresql+asyncpg://x/y")
    assert result.returncode == 2
    assert one_line(result) == "modelforge worker: MODELFORGE_NATS_URL is required"


def test_events_tail_without_a_stack_says_what_to_do(tmp_path: Path) -> None:
    result = modelforge("events", "tail", MODELFORGE_DATA_DIR=str(tmp_path))
    assert result.returncode == 2
    line = one_line(result)
    assert f"no {tmp_path}/stack.json" in line and "modelforge up" in line


def test_events_tail_uses_the_stack_file_and_reports_an_unreachable_nats(
    tmp_path: Path,
) -> None:
    # A stack file of a live process (this one) whose NATS does not answer.
    write_stack_info(info(tmp_path, os.getpid()))
    result = modelforge("events", "tail", MODELFORGE_DATA_DIR=str(tmp_path), timeout_s=60)
    assert result.returncode == 1
    assert one_line(result).startswith("modelforge events: NATS at nats://127.0.0.1:9: ")


def test_a_stack_file_left_by_a_killed_up_is_stale(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    write_stack_info(info(tmp_path, int(dead.stdout)))
    with pytest.raises(StackFileError, match="is stale"):
        read_stack_info(tmp_path)
    write_stack_info(info(tmp_path, os.getpid()))
    assert read_stack_info(tmp_path).pid == os.getpid()


def test_an_unknown_event_type_is_a_usage_error(tmp_path: Path) -> None:
    result = modelforge("events", "tail", "--type", "node.nope", "--nats-url", "nats://x:9")
    assert result.returncode == 2
    assert one_line(result).startswith("modelforge events: unknown event type 'node.nope'")
