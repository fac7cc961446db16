"""Settings of commands that only need NATS (`modelforge events ...`)."""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict


class NatsSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MODELFORGE_", extra="ignore")

    nats_url: str = "nats://127.0.0.1:4222"
