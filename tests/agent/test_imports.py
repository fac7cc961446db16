"""The agent installs without the server stack: no agent module imports it."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.agent.harness import REPO, clean_env

FORBIDDEN = (
    "api",
    "workers",
    "store",
    "broker",
    "stack",
    "fastapi",
    "starlette",
    "uvicorn",
    "sqlalchemy",
    "asyncpg",
    "alembic",
    "nats",
    "dramatiq",
)

SCRIPT = """
import importlib, json, pkgutil, sys
import agent
names = ["agent"] + [m.name for m in pkgutil.walk_packages(agent.__path__, "agent.")]
for name in names:
    importlib.import_module(name)
import cli.main
cli.main.build_parser().parse_args(["agent", "--config", "x.yaml"])
cli.main.build_parser().parse_args(["simulate", "--nodes", "3"])
print(json.dumps({"imported": names, "modules": sorted(sys.modules)}))
"""


def test_no_agent_module_imports_the_server_stack() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    report = json.loads(result.stdout)
    assert {"agent.runner", "agent.simulator", "agent.collectors.nvml"} <= set(report["imported"])
    loaded = {name.split(".")[0] for name in report["modules"]}
    assert not loaded & set(FORBIDDEN), sorted(loaded & set(FORBIDDEN))
    # The only shared code: the wire models.
    assert "schemas.agent" in report["modules"]
