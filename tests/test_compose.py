"""compose.yaml is valid and wires the services as documented.

Checked with `docker-compose config`, which needs no Docker engine; .ci/run installs the
Debian package, so this only skips on a machine without that binary.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
COMPOSE = shutil.which("docker-compose")

pytestmark = pytest.mark.skipif(
    COMPOSE is None,
    reason="the docker-compose binary is absent (Debian: apt-get install docker-compose)",
)


def compose_config(tmp_path: Path, **variables: str) -> subprocess.CompletedProcess[str]:
    assert COMPOSE is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELFORGE_")}
    env.update(variables)
    # An empty env file, so a developer's .env cannot supply the required variable.
    env_file = tmp_path / "empty.env"
    env_file.write_text("")
    return subprocess.run(
        [COMPOSE, "--env-file", str(env_file), "-f", str(REPO / "compose.yaml"), "config"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_compose_services_and_wiring(tmp_path: Path) -> None:
    result = compose_config(tmp_path, MODELFORGE_OPERATOR_API_KEY="compose-test-key")
    assert result.returncode == 0, result.stderr
    config: dict[str, Any] = yaml.safe_load(result.stdout)
    services = config["services"]
    assert set(services) >= {"postgres", "nats", "migrate", "api", "worker"}

    assert services["postgres"]["image"] == "postgres:16"
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])
    assert services["nats"]["image"].startswith("nats:2.10")
    assert "-js" in services["nats"]["command"]
    assert "http://localhost:8222/healthz" in services["nats"]["healthcheck"]["test"]

    for name in ("migrate", "api", "worker"):
        service = services[name]
        assert service["image"] == "modelforge:local"
        assert Path(service["build"]["context"]) == REPO
        assert service["command"][:2] == ["modelforge", name]
        env = service["environment"]
        assert env["MODELFORGE_DATABASE_URL"].startswith("postgresql+asyncpg://")
        assert env["MODELFORGE_NATS_URL"] == "nats://nats:4222"
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("api", "worker"):
        depends = services[name]["depends_on"]
        assert depends["migrate"]["condition"] == "service_completed_successfully"
        assert depends["nats"]["condition"] == "service_healthy"

    api = services["api"]
    assert api["environment"]["MODELFORGE_OPERATOR_API_KEY"] == "compose-test-key"
    assert any(port["target"] == 8080 for port in api["ports"])
    assert "/healthz" in " ".join(api["healthcheck"]["test"])
    assert (REPO / "Dockerfile").is_file()


def test_compose_requires_an_operator_key(tmp_path: Path) -> None:
    result = compose_config(tmp_path)
    assert result.returncode != 0
    assert "set an operator key" in result.stderr


def test_compose_nats_cluster_profile(tmp_path: Path) -> None:
    servers = ["nats-1", "nats-2", "nats-3"]
    url = ",".join(f"nats://{name}:4222" for name in servers)
    result = compose_config(
        tmp_path,
        MODELFORGE_OPERATOR_API_KEY="compose-test-key",
        MODELFORGE_NATS_URL=url,
        MODELFORGE_REPLICAS="3",
    )
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    routes = ",".join(f"nats://{name}:6222" for name in servers)
    volumes = set()
    for name in servers:
        service = services[name]
        assert service["profiles"] == ["nats-cluster"]
        assert service["image"].startswith("nats:2.10")
        command = service["command"]
        assert command[command.index("--server_name") + 1] == name
        assert command[command.index("--cluster_name") + 1] == "modelforge"
        assert command[command.index("--routes") + 1] == routes
        assert "-js" in command
        assert "http://localhost:8222/healthz" in service["healthcheck"]["test"]
        volume = service["volumes"][0]  # "source:target:mode" or a mapping, by version
        volumes.add(volume.split(":")[0] if isinstance(volume, str) else volume["source"])
    assert len(volumes) == len(servers)  # a store dir each
    # The single server stays the default; the profile's servers are opt-in.
    assert "profiles" not in services["nats"]
    for name in ("migrate", "api", "worker"):
        env = services[name]["environment"]
        assert env["MODELFORGE_NATS_URL"] == url
        assert env["MODELFORGE_REPLICAS"] == "3"
    default = compose_config(tmp_path, MODELFORGE_OPERATOR_API_KEY="compose-test-key")
    worker = yaml.safe_load(default.stdout)["services"]["worker"]["environment"]
    assert worker["MODELFORGE_REPLICAS"] == "1"
