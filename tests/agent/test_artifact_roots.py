"""An artifact root the agent offers but that does not exist: one warning at start naming
it (a job for it would fail `path_not_allowed`); the agent still runs, and a root that
exists is not warned about."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.agent.harness import AgentProcess, new_token, write_config
from tests.api_server import RunningApi


def test_a_missing_artifact_root_is_one_warning_at_start(
    api: RunningApi, agents: Callable[..., AgentProcess], tmp_path: Path
) -> None:
    present = tmp_path / "models"
    present.mkdir()
    missing = tmp_path / "not-mounted"
    config = write_config(
        tmp_path / "agent.yaml",
        api_url=api.base_url,
        state_dir=str(tmp_path / "state"),
        enrollment_token=new_token(api),
        artifact_roots=[str(present), str(missing)],
    )
    agent = agents(config)
    agent.wait_for_log(r"enrolled as node")
    warnings = [line for line in agent.output.splitlines() if "artifact root" in line]
    assert len(warnings) == 1, agent.output
    assert str(missing) in warnings[0] and "does not exist" in warnings[0]
    assert "WARNING" in warnings[0]
