"""Agent configuration: a tracked YAML file with placeholders, a machine-specific YAML
override deep-merged over it, then `MODELFORGE_AGENT_*` environment variables, which win.

    modelforge agent --config agent.example.yaml --config-override agent.local.yaml

Relative paths are taken from the working directory; prefer absolute ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from agent.client import TlsOptions
from agent.errors import ConfigError
from agent.failover import checked_endpoint, checked_failover
from schemas.base import RootPath
from schemas.hub import HUB_URL

ENV_PREFIX = "MODELFORGE_AGENT_"
SettingsT = TypeVar("SettingsT", bound=BaseSettings)
Collector = Literal["nvml", "simulated", "none"]


class YamlSettings(BaseSettings):
    """Settings read from YAML files (passed as init values) and the environment."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # First wins: the environment over the YAML files.
        return (env_settings, init_settings)


class AgentConfig(YamlSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="forbid",
        # A rejected value may be a token: errors name the field, never the input.
        hide_input_in_errors=True,
    )

    api_url: str = Field(description="the control plane, e.g. https://modelforge.internal:8443")
    # More endpoints of the same control plane, used in order when the current one
    # cannot be reached (agent/failover.py).
    api_urls: list[str] = Field(default_factory=list, max_length=16)
    state_dir: Path = Field(description="identity, credential and stream cursors (0700)")
    # First start only; ignored once the state dir holds an identity.
    enrollment_token: SecretStr | None = None
    enrollment_token_file: Path | None = None
    # Reported as a fact; never the node's identity.
    hostname: str | None = Field(default=None, min_length=1, max_length=255)

    ca_bundle: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None
    # Honour HTTP(S)_PROXY / NO_PROXY from the environment.
    trust_env: bool = True

    # nvml: the real GPUs. simulated: fake GPUs (development, tests, demos).
    # none: a host without GPUs (inventory is complete with no GPUs).
    collector: Collector = "nvml"
    simulated_gpus: int = Field(default=2, ge=0, le=64)
    # Seeds the simulated GPU UUIDs; default: the node id, so they are stable per node.
    simulated_seed: str | None = None
    storage_paths: list[str] = Field(default_factory=lambda: ["/"], max_length=64)
    # Directories artifact jobs may write into (absolute, normalised). Reported in the
    # inventory; the control plane refuses a job for any other root.
    artifact_roots: list[RootPath] = Field(default_factory=list, max_length=16)
    # Where artifact files come from: a Hub-layout source (the Hub or a mirror), and a
    # file holding its token, if it needs one. With no artifact_roots no job is claimed.
    artifact_source_url: str = HUB_URL
    artifact_source_token_file: Path | None = None
    # Claims are polled this often (notifications, when they arrive, only cut latency).
    job_poll_interval_s: float = Field(default=5.0, gt=0)
    # A download with no bytes for this long fails the attempt as `stalled`.
    artifact_stall_s: float = Field(default=30.0, gt=0)
    artifact_progress_interval_s: float = Field(default=2.0, gt=0)
    # Staging that no attempt will resume (the job ended while the agent was down) is
    # swept at start and then this often, between jobs (agent/jobs/sweep.py)...
    artifact_staging_sweep_s: float = Field(default=600.0, gt=0)
    # ...and, when the control plane cannot say, once nothing in it changed for this long.
    artifact_staging_max_age_s: float = Field(default=7 * 86400.0, gt=0)

    # None: the interval the server asks for in its answers.
    heartbeat_interval_s: float | None = Field(default=None, gt=0)
    telemetry_interval_s: float = Field(default=15.0, gt=0)
    # Inventory is collected this often and sent when it changed...
    inventory_check_interval_s: float = Field(default=30.0, gt=0)
    # ...and sent at least this often even when it did not.
    inventory_interval_s: float = Field(default=600.0, gt=0)
    request_timeout_s: float = Field(default=10.0, gt=0)
    retry_initial_s: float = Field(default=0.5, gt=0)
    retry_max_s: float = Field(default=30.0, gt=0)
    # Attempts at one heartbeat, inventory or telemetry publication on transport errors,
    # 5xx and 429 before it is dropped: newer state follows at the next interval.
    retry_max_attempts: int = Field(default=5, ge=1, le=100)
    # Attempts at enrolling on transport errors, 5xx and 429 before the agent exits with
    # status 1 (with the default backoff, about 20 minutes): a supervisor such as
    # systemd then decides, and nothing retries forever unseen.
    enroll_max_attempts: int = Field(default=45, ge=1, le=100_000)
    # After 401 credential_revoked/invalid: watch the state dir this long for a replacement
    # installed with `modelforge agent install-credential` before stopping.
    credential_reload_wait_s: float = Field(default=30.0, ge=0)
    # Sequence numbers reserved per state write (a crash skips at most this many).
    sequence_block: int = Field(default=64, ge=1, le=1_000_000)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @field_validator("api_url")
    @classmethod
    def _url(cls, value: str) -> str:
        return checked_endpoint(value)

    @model_validator(mode="after")
    def _failover(self) -> AgentConfig:
        self.api_urls = checked_failover(self.api_url, self.api_urls)
        return self

    @model_validator(mode="after")
    def _consistent(self) -> AgentConfig:
        if self.enrollment_token is not None and self.enrollment_token_file is not None:
            raise ValueError("set enrollment_token or enrollment_token_file, not both")
        if self.client_key is not None and self.client_cert is None:
            raise ValueError("client_key needs client_cert")
        if self.retry_max_s < self.retry_initial_s:
            raise ValueError("retry_max_s must be at least retry_initial_s")
        return self

    @property
    def tls(self) -> TlsOptions:
        return TlsOptions(self.ca_bundle, self.client_cert, self.client_key)

    def enrollment_token_value(self) -> str | None:
        if self.enrollment_token is not None:
            return self.enrollment_token.get_secret_value().strip() or None
        if self.enrollment_token_file is not None:
            try:
                return self.enrollment_token_file.read_text().strip() or None
            except OSError as exc:
                raise ConfigError(
                    f"cannot read enrollment_token_file {self.enrollment_token_file}: "
                    f"{exc.strerror}"
                ) from None
        return None


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """override over base; nested mappings merge, everything else is replaced."""
    merged = dict(base)
    for key, value in override.items():
        current = merged.get(key)
        if isinstance(current, Mapping) and isinstance(value, Mapping):
            merged[key] = deep_merge(current, value)
        else:
            merged[key] = value
    return merged


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"config file {path} is not valid YAML{where}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path} must be a mapping of settings")
    return loaded


def load_settings(
    model: type[SettingsT],
    what: str,
    config: Path | None,
    override: Path | None,
    values: Mapping[str, Any],
) -> SettingsT:
    """Base file, override file, keyword values, then the environment (which wins)."""
    data: dict[str, Any] = {}
    for path in (config, override):
        if path is not None:
            data = deep_merge(data, read_yaml(path))
    data = deep_merge(data, values)
    try:
        return model(**data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc']) or 'config'}: {error['msg']}"
            for error in exc.errors()
        )
        raise ConfigError(f"invalid {what} configuration: {problems}") from None


def load_config(
    config: Path | None = None, override: Path | None = None, **values: Any
) -> AgentConfig:
    return load_settings(AgentConfig, "agent", config, override, values)
