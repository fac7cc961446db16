"""The llama-server allow-list against the llama-server we build: every flag its `--help`
prints is either allowed (with a type and bounds) or refused by family, so a llama.cpp
upgrade cannot add a flag that reaches a node unexamined; and the table's own rules."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from agent.runtime.server import child_environment
from schemas.llama_flags import (
    ALIASES,
    ALLOWED,
    LOCAL_REFUSED,
    REFUSED,
    Family,
    local_refusals,
    profile_refusals,
)

_FLAG = re.compile(r"\s*(--?[A-Za-z0-9][\w.+-]*)\s*(,)?")


def help_flags(text: str) -> set[str]:
    """Every spelling of every flag in `--help`: the names a line starts with, up to the
    first one not followed by a comma (the value hint and description follow)."""
    names: set[str] = set()
    for line in text.splitlines():
        if not line.startswith("-"):
            continue
        position = 0
        while match := _FLAG.match(line, position):
            names.add(match.group(1).lstrip("-"))
            if match.group(2) is None:
                break
            position = match.end()
    return names


def test_every_flag_of_the_built_llama_server_is_allowed_or_refused(
    llama_server: Path,
) -> None:
    result = subprocess.run(
        [str(llama_server), "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    flags = help_flags(result.stdout + result.stderr)
    assert len(flags) > 200, "the help output was not read"
    unexamined = sorted(flags - set(ALLOWED) - set(REFUSED) - set(ALIASES))
    assert unexamined == [], (
        f"llama-server has flags the allow-list does not classify: {unexamined}; add each "
        "to schemas/llama_flags.py, ALLOWED with its type and bounds or REFUSED by family"
    )
    # What the tables name that this build does not have is a stale entry.
    assert set(ALLOWED) <= flags, sorted(set(ALLOWED) - flags)


def test_the_tables_do_not_overlap() -> None:
    assert not set(ALLOWED) & set(REFUSED)
    assert not set(ALIASES) & (set(ALLOWED) | set(REFUSED))
    assert set(ALIASES.values()) <= set(ALLOWED)


def test_the_dangerous_families_are_classified_as_such() -> None:
    for flag in ("agent", "tools", "tools-runtime", "mcp-servers-config", "mcp-servers-json",
                 "webui", "ui", "ui-mcp-proxy", "webui-config-file"):  # fmt: skip
        assert REFUSED[flag] is Family.TOOLS
    for flag in ("log-file", "slot-save-path", "media-path", "models-dir", "lora"):
        assert flag in REFUSED
    assert {Family.TOOLS, Family.MANAGED} == LOCAL_REFUSED


def test_profile_refusals_check_type_and_bounds() -> None:
    assert profile_refusals({"parallel": 4, "temp": 0.2, "cont-batching": True}) == []
    refused = {r.flag: r.reason for r in profile_refusals(
        {"parallel": 0.5, "top-p": 2, "agent": True, "np": 2, "pooling": "max"})}  # fmt: skip
    assert set(refused) == {"parallel", "top-p", "agent", "np", "pooling"}
    assert "integer" in refused["parallel"] and "refused (tools)" in refused["agent"]
    assert "spelled parallel" in refused["np"]


def test_the_node_operator_keeps_files_but_never_tools() -> None:
    assert local_refusals({"log-file": "/var/log/x", "slot-save-path": "/srv"}) == []
    assert [r.flag for r in local_refusals({"agent": True, "port": 1, "temp": 1})] == [
        "agent",
        "port",
    ]


@pytest.mark.parametrize(
    "name", ["LLAMA_ARG_TOOLS", "LLAMA_ARG_HOST", "LLAMA_API_KEY", "LLAMA_APP_CMD", "HF_TOKEN",
             "MTMD_BACKEND_DEVICE", "CUDA_VISIBLE_DEVICES", "llama_arg_agent"],
)  # fmt: skip
def test_llama_server_inherits_no_variable_that_would_set_a_flag(name: str) -> None:
    kept = child_environment({name: "x", "PATH": "/usr/bin", "HOME": "/root"})
    assert kept == {"PATH": "/usr/bin", "HOME": "/root"}
