"""Settings of commands that only need the database (`modelforge migrate`)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class DatabaseSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MODELFORGE_", extra="ignore")

    database_url: str = Field(description="SQLAlchemy URL, postgresql+asyncpg://...")
