"""API process settings, read from MODELFORGE_* environment variables in main()."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class ApiSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MODELFORGE_", extra="ignore")

    database_url: str = Field(description="SQLAlchemy URL, postgresql+asyncpg://...")
    nats_url: str = "nats://127.0.0.1:4222"
    # Unset or empty: every admin route refuses (fail closed).
    operator_api_key: SecretStr | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    heartbeat_interval_s: float = Field(default=10.0, gt=0)
    stale_after_s: float = Field(default=30.0, gt=0)
    offline_after_s: float = Field(default=90.0, gt=0)
    future_skew_limit_s: float = Field(default=300.0, ge=0)
    max_body_bytes: int = Field(default=1_048_576, gt=0)
    db_pool_size: int = Field(default=10, gt=0)
    log_level: str = "INFO"

    @property
    def admin_enabled(self) -> bool:
        return bool(self.operator_api_key and self.operator_api_key.get_secret_value())
