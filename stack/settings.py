"""Settings of `modelforge up`, read from MODELFORGE_* environment variables in main()."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class StackSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MODELFORGE_", extra="ignore")

    data_dir: Path = Path(".modelforge")
    # Set: use that server instead of starting the embedded one.
    database_url: str | None = None
    nats_url: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(default=8080, gt=0, lt=65536)
    # `modelforge api --processes`; unset: its default, the machine's cores.
    api_processes: int | None = Field(default=None, ge=1)
    # Unset: generated on the first run and kept in <data_dir>/operator_api_key.
    operator_api_key: SecretStr | None = None
