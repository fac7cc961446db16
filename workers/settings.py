"""Worker process settings (outbox relay for now), read in main()."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class RelaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MODELFORGE_", extra="ignore")

    database_url: str
    nats_url: str = "nats://127.0.0.1:4222"
    relay_batch_size: int = Field(default=200, gt=0)
    relay_poll_interval_s: float = Field(default=0.2, gt=0)
    log_level: str = "INFO"
