"""Settings of commands that only need NATS (`modelforge events ...`)."""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict


class NatsSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MODELFORGE_", extra="ignore")

    # Unset: the NATS of the running `modelforge up` (its stack file), or an error.
    nats_url: str | None = None
