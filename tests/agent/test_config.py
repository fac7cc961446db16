"""Configuration: tracked YAML + machine override (deep-merged) + MODELFORGE_AGENT_* env."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.config import AgentConfig, deep_merge, load_config
from agent.errors import ConfigError
from tests.agent.harness import REPO, clean_env

EXAMPLE = REPO / "agent" / "agent.example.yaml"
SECRET = "mfe.0123456789abcdef0123456789abcdef.canary-secret-value-0123456789"


@pytest.fixture(autouse=True)
def no_agent_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("MODELFORGE_AGENT_"):
            monkeypatch.delenv(name)


def write(path: Path, data: object) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.fast
def test_deep_merge_replaces_leaves_and_merges_mappings() -> None:
    base = {"a": 1, "nested": {"x": 1, "y": {"z": 1}}, "list": [1, 2]}
    override = {"nested": {"y": {"w": 2}}, "list": [3], "b": 2}
    assert deep_merge(base, override) == {
        "a": 1,
        "b": 2,
        "nested": {"x": 1, "y": {"z": 1, "w": 2}},
        "list": [3],
    }
    assert base["nested"] == {"x": 1, "y": {"z": 1}}  # inputs untouched


@pytest.mark.fast
def test_override_file_then_environment_win(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = write(
        tmp_path / "base.yaml",
        {
            "api_url": "https://placeholder.example:8443",
            "state_dir": "/placeholder",
            "telemetry_interval_s": 15,
        },
    )
    override = write(
        tmp_path / "local.yaml", {"state_dir": str(tmp_path / "state"), "collector": "simulated"}
    )
    config = load_config(base, override)
    assert config.api_url == "https://placeholder.example:8443"
    assert config.state_dir == tmp_path / "state"
    assert config.collector == "simulated" and config.telemetry_interval_s == 15

    monkeypatch.setenv("MODELFORGE_AGENT_API_URL", "https://api.internal:8443/")
    monkeypatch.setenv("MODELFORGE_AGENT_TELEMETRY_INTERVAL_S", "2.5")
    monkeypatch.setenv("MODELFORGE_AGENT_STORAGE_PATHS", '["/", "/data"]')
    monkeypatch.setenv("MODELFORGE_AGENT_LOG_LEVEL", "debug")
    config = load_config(base, override)
    assert config.api_url == "https://api.internal:8443"
    assert config.telemetry_interval_s == 2.5
    assert config.storage_paths == ["/", "/data"]
    assert config.log_level == "DEBUG"
    assert config.state_dir == tmp_path / "state"


@pytest.mark.fast
def test_the_tracked_example_is_valid_and_holds_only_placeholders() -> None:
    config = load_config(EXAMPLE)
    assert "example" in config.api_url and config.api_url.startswith("https://")
    assert config.collector == "nvml"
    assert config.enrollment_token is None  # secrets never in the tracked file
    assert config.ca_bundle is not None


@pytest.mark.fast
def test_enrollment_token_from_config_env_or_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base: dict[str, Any] = {"api_url": "http://127.0.0.1:1", "state_dir": str(tmp_path)}
    assert load_config(**base).enrollment_token_value() is None
    assert load_config(**base, enrollment_token=SECRET).enrollment_token_value() == SECRET
    token_file = tmp_path / "token"
    token_file.write_text(f"  {SECRET}\n")
    config = load_config(**base, enrollment_token_file=str(token_file))
    assert config.enrollment_token_value() == SECRET
    monkeypatch.setenv("MODELFORGE_AGENT_ENROLLMENT_TOKEN", SECRET)
    assert load_config(**base).enrollment_token_value() == SECRET
    assert SECRET not in repr(load_config(**base))
    with pytest.raises(ConfigError, match="not both"):
        load_config(**base, enrollment_token_file=str(token_file))
    monkeypatch.delenv("MODELFORGE_AGENT_ENROLLMENT_TOKEN")
    missing = load_config(**base, enrollment_token_file=str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match="cannot read enrollment_token_file"):
        missing.enrollment_token_value()


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"bogus_setting": 1}, "bogus_setting"),
        ({"api_url": "ftp://x"}, "api_url"),
        ({"collector": "auto"}, "collector"),
        ({"telemetry_interval_s": 0}, "telemetry_interval_s"),
        ({"client_key": "/k.pem"}, "client_key needs client_cert"),
        ({"enrollment_token": [SECRET]}, "enrollment_token"),
        ({"api_urls": ["ftp://y"]}, "api_urls must start with https://"),
        ({"api_urls": ["http://127.0.0.1:1/"]}, "must not repeat"),
        ({"api_urls": ["http://127.0.0.1:2", "http://127.0.0.1:2"]}, "must not repeat"),
        ({"api_urls": ["http://127.0.0.1:2/other"]}, "not on api_url's path"),
    ],
)
@pytest.mark.fast
def test_invalid_settings_are_named_without_echoing_values(
    tmp_path: Path, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        load_config(**{"api_url": "http://127.0.0.1:1", "state_dir": str(tmp_path), **values})
    assert SECRET not in str(caught.value)
    assert "canary" not in str(caught.value)


@pytest.mark.fast
def test_unreadable_or_odd_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"api_url: [unclosed {SECRET}\n")
    with pytest.raises(ConfigError, match="not valid YAML") as caught:
        load_config(bad)
    assert SECRET not in str(caught.value)
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(tmp_path / "list.yaml")
    (tmp_path / "empty.yaml").write_text("")
    with pytest.raises(ConfigError, match="api_url"):
        load_config(tmp_path / "empty.yaml")


@pytest.mark.fast
def test_failover_endpoints_are_normalised(tmp_path: Path) -> None:
    config = load_config(
        api_url="https://a.internal:8443/",
        api_urls=["https://b.internal:8443/", "http://127.0.0.1:8080"],
        state_dir=str(tmp_path),
    )
    assert config.api_url == "https://a.internal:8443"
    assert config.api_urls == ["https://b.internal:8443", "http://127.0.0.1:8080"]


@pytest.mark.fast
def test_defaults() -> None:
    config = AgentConfig(api_url="https://a", state_dir=Path("/s"))
    assert config.collector == "nvml" and config.heartbeat_interval_s is None
    assert config.trust_env is True and config.log_level == "INFO"


def test_cli_reports_config_problems_with_status_1_and_needs_config(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cli.main", "agent", *args],
            cwd=REPO,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    missing = run()
    assert missing.returncode == 2 and "--config FILE is required" in missing.stderr
    config = write(
        tmp_path / "a.yaml", {"api_url": "http://x", "state_dir": str(tmp_path), "nope": 1}
    )
    bad = run("--config", str(config))
    assert bad.returncode == 1 and "nope" in bad.stderr
