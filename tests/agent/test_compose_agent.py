"""compose.yaml runs a simulated agent fleet against its API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_compose import COMPOSE, compose_config


@pytest.mark.skipif(COMPOSE is None, reason="the docker-compose binary is absent")
def test_compose_has_a_simulated_agent(tmp_path: Path) -> None:
    result = compose_config(tmp_path, MODELFORGE_OPERATOR_API_KEY="compose-test-key")
    assert result.returncode == 0, result.stderr
    services: dict[str, Any] = yaml.safe_load(result.stdout)["services"]
    sim = services["sim-agent"]
    assert sim["image"] == "modelforge:local"
    command = sim["command"]
    assert command[:2] == ["modelforge", "simulate"]
    assert command[command.index("--api-url") + 1] == "http://api:8080"
    assert int(command[command.index("--nodes") + 1]) >= 1
    assert sim["environment"]["MODELFORGE_OPERATOR_API_KEY"] == "compose-test-key"
    assert sim["depends_on"]["api"]["condition"] == "service_healthy"
    assert sim["restart"] == "no"
    # Agents reach the API only: no database or broker settings.
    assert not any(
        k in sim["environment"] for k in ("MODELFORGE_DATABASE_URL", "MODELFORGE_NATS_URL")
    )
