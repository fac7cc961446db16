"""The llama-server allow-list against the llama-server we build: every flag its `--help`
prints is either allowed (with a type and bounds) or refused by family, so a llama.cpp
upgrade cannot add a flag that reaches a node unexamined; and the table's own rules."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from agent.runtime.server import child_environment
from schemas.llama_flag_types import ArgType, Choice, Switch, Whole
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


def help_entries(text: str) -> dict[str, str]:
    """Every spelling of every flag in `--help` with its description: the names a line
    starts with, up to the first one not followed by a comma (the value hint and the
    description follow, continued on the lines indented below)."""
    entries: dict[str, str] = {}
    current: list[str] = []
    for line in text.splitlines():
        if not line.startswith("-"):
            for name in current:
                entries[name] += " " + line.strip()
            continue
        current = []
        position = 0
        while match := _FLAG.match(line, position):
            current.append(match.group(1).lstrip("-"))
            if match.group(2) is None:
                break
            position = match.end()
        for name in current:
            entries[name] = line[position:]
    return entries


def help_flags(text: str) -> set[str]:
    return set(help_entries(text))


def test_every_flag_of_the_built_llama_server_is_allowed_or_refused(
    llama_server: Path,
) -> None:
    result = subprocess.run(
        [str(llama_server), "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    entries = help_entries(result.stdout + result.stderr)
    flags = set(entries)
    assert len(flags) > 200, "the help output was not read"
    unexamined = sorted(flags - set(ALLOWED) - set(REFUSED) - set(ALIASES))
    assert unexamined == [], (
        f"llama-server has flags the allow-list does not classify: {unexamined}; add each "
        "to schemas/llama_flags.py, ALLOWED with its type and bounds or REFUSED by family"
    )
    # What the tables name that this build does not have is a stale entry.
    stale = sorted((set(ALLOWED) | set(REFUSED) | set(ALIASES)) - flags)
    assert stale == [], f"schemas/llama_flags.py names flags this build lacks: {stale}"
    # A flag llama.cpp removed makes the server refuse to start: never allowed.
    removed = {name for name, text in entries.items() if "has been removed" in text}
    assert removed, "the help's removed arguments were not read"
    allowed = removed & (set(ALLOWED) | set(ALIASES))
    assert not allowed, f"removed from llama.cpp but allowed: {sorted(allowed)}"
    assert all(REFUSED[name] is Family.REMOVED for name in removed)


@pytest.mark.fast
def test_the_tables_do_not_overlap() -> None:
    assert not set(ALLOWED) & set(REFUSED)
    assert not set(ALIASES) & (set(ALLOWED) | set(REFUSED))
    assert set(ALIASES.values()) <= set(ALLOWED)


@pytest.mark.fast
def test_the_dangerous_families_are_classified_as_such() -> None:
    for flag in ("agent", "tools", "tools-runtime", "mcp-servers-config", "mcp-servers-json",
                 "webui", "ui", "ui-mcp-proxy", "webui-config-file"):  # fmt: skip
        assert REFUSED[flag] is Family.TOOLS
    for flag in ("log-file", "slot-save-path", "media-path", "models-dir", "lora"):
        assert flag in REFUSED
    assert {Family.TOOLS, Family.MANAGED} == LOCAL_REFUSED


@pytest.mark.fast
def test_profile_refusals_check_type_and_bounds() -> None:
    assert profile_refusals({"parallel": 4, "temp": 0.2, "cont-batching": True}) == []
    refused = {r.flag: r.reason for r in profile_refusals(
        {"parallel": 0.5, "top-p": 2, "agent": True, "np": 2, "pooling": "max"})}  # fmt: skip
    assert set(refused) == {"parallel", "top-p", "agent", "np", "pooling"}
    assert "integer" in refused["parallel"] and "refused (tools)" in refused["agent"]
    assert "spelled parallel" in refused["np"]


@pytest.mark.fast
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
@pytest.mark.fast
def test_llama_server_inherits_no_variable_that_would_set_a_flag(name: str) -> None:
    kept = child_environment({name: "x", "PATH": "/usr/bin", "HOME": "/root"})
    assert kept == {"PATH": "/usr/bin", "HOME": "/root"}


# They would silence the error this test reads (their own parsing is llama.cpp's).
_SILENCING = frozenset({"log-disable", "verbosity"})


def _bound_value(kind: ArgType, end: int) -> list[str]:
    if isinstance(kind, Switch):
        return []
    if isinstance(kind, Choice):
        return [kind.values[end]]
    bound = (kind.lo, kind.hi)[end]
    return [str(bound) if isinstance(kind, Whole) else f"{bound:g}"]


@pytest.mark.parametrize("end", [0, -1], ids=["lower-bounds", "upper-bounds"])
def test_the_built_llama_server_takes_every_allowed_flag_at_its_bounds(
    llama_server: Path, tmp_path: Path, end: int
) -> None:
    """Parsed before the model is loaded: a flag or value it does not take stops it
    with "error while handling argument" before it ever looks for the model."""
    argv = [str(llama_server), "--model", str(tmp_path / "absent.gguf")]
    for name, kind in ALLOWED.items():
        if name not in _SILENCING:
            argv += [f"--{name}", *_bound_value(kind, end)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    output = result.stdout + result.stderr
    assert "absent.gguf" in output, output[-3000:]
    assert "error while handling argument" not in output, output[-3000:]
    assert "invalid argument" not in output.lower(), output[-3000:]
