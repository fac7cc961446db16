"""Settings of the store: the database (`modelforge migrate`), and the lease rules that
the API and the workers share."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from store.deployments.rules import ReconcilePolicy
from store.leases import LeasePolicy


class DatabaseSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MODELFORGE_", extra="ignore")

    database_url: str = Field(description="SQLAlchemy URL, postgresql+asyncpg://...")


class LeaseSettings(BaseSettings):
    """Job leases (store/leases.py). The API (claims, reports) and the workers (expiry,
    retries) must agree on these; both settings classes include them."""

    model_config = SettingsConfigDict(env_prefix="MODELFORGE_", extra="ignore")

    job_lease_s: float = Field(default=60.0, gt=0, le=3600)
    job_retry_base_s: float = Field(default=5.0, ge=0)
    job_retry_max_s: float = Field(default=300.0, ge=0)
    # A ready deployment's health is checked this often (deployment.health.v1); the
    # API (settling a load) and the reconciler both schedule it.
    deployment_health_period_s: float = Field(default=30.0, gt=0)

    def reconcile_policy(self) -> ReconcilePolicy:
        return ReconcilePolicy(health_period_s=self.deployment_health_period_s)

    def lease_policy(self) -> LeasePolicy:
        return LeasePolicy(
            lease_s=self.job_lease_s,
            retry_base_s=self.job_retry_base_s,
            retry_max_s=self.job_retry_max_s,
        )
