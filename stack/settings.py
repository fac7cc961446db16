"""Settings of `modelforge up`, read from MODELFORGE_* environment variables in main()."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.hub import HUB_URL
from store.settings import DatabaseUrl


class StackSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MODELFORGE_", extra="ignore")

    data_dir: Path = Path(".modelforge")
    # Set: use that server instead of starting the embedded one.
    database_url: DatabaseUrl | None = None
    nats_url: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(default=8080, gt=0, lt=65536)
    # `modelforge api --processes`; unset: its default, the machine's cores.
    api_processes: int | None = Field(default=None, ge=1)
    # Unset: generated on the first run and kept in <data_dir>/operator_api_key.
    operator_api_key: SecretStr | None = None
    # Where the API resolves artifacts (MODELFORGE_ARTIFACT_SOURCE_URL, which the API reads
    # itself): `up` names it in its banner and in stack.json, for the agents.
    artifact_source_url: str = HUB_URL
    # The API's per-request log lines (`up --access-log`, MODELFORGE_ACCESS_LOG).
    access_log: bool = False

    @field_validator("database_url", mode="before")
    @classmethod
    def _unset_when_empty(cls, value: Any) -> Any:
        # MODELFORGE_DATABASE_URL= (empty) means the embedded server, as unset does.
        return value or None
