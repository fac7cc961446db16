"""The agent installs without the server stack: no agent module imports it. The runtime
worker (agent/runtime/) adds only its local HTTP server (the `runtime` extra)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.agent.harness import REPO, clean_env

SERVER_STACK = (
    "api",
    "workers",
    "store",
    "broker",
    "stack",
    "fastapi",
    "sqlalchemy",
    "asyncpg",
    "alembic",
    "nats",
    "dramatiq",
)
LOCAL_HTTP_SERVER = ("starlette", "uvicorn")

SCRIPT = """
import importlib, json, pkgutil, sys
import agent
runtime = sys.argv[1] == "runtime"
names = ["agent"] + [m.name for m in pkgutil.walk_packages(agent.__path__, "agent.")]
names = [n for n in names if n.startswith("agent.runtime") == runtime]
for name in names:
    importlib.import_module(name)
import cli.main
cli.main.build_parser().parse_args(["agent", "--config", "x.yaml"])
cli.main.build_parser().parse_args(["runtime", "--config", "x.yaml"])
cli.main.build_parser().parse_args(["simulate", "--nodes", "3"])
print(json.dumps({"imported": names, "modules": sorted(sys.modules)}))
"""


def imported(part: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, part],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    report: dict[str, Any] = json.loads(result.stdout)
    return report


@pytest.mark.parametrize(
    ("part", "expected", "forbidden"),
    [
        (
            "agent",
            {"agent.runner", "agent.simulator", "agent.collectors.nvml"},
            SERVER_STACK + LOCAL_HTTP_SERVER,
        ),
        ("runtime", {"agent.runtime.api", "agent.runtime.server"}, SERVER_STACK),
    ],
)
def test_no_agent_module_imports_the_server_stack(
    part: str, expected: set[str], forbidden: tuple[str, ...]
) -> None:
    report = imported(part)
    assert expected <= set(report["imported"])
    loaded = {name.split(".")[0] for name in report["modules"]}
    assert not loaded & set(forbidden), sorted(loaded & set(forbidden))
    # The only shared code: the wire models.
    assert "schemas.agent" in report["modules"] or "schemas.runtime" in report["modules"]
