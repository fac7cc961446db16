"""Settings of the store: the database (`modelforge migrate`), and the lease rules that
the API and the workers share."""

from __future__ import annotations

import re
from typing import Annotated, Final

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, SettingsConfigDict

from store.deployments.rules import ReconcilePolicy
from store.leases import LeasePolicy

# The one driver the store speaks: the engines and the LISTEN connections
# (store/notify.py) are asyncpg's. Any other scheme passed the settings and failed each
# process at its first connection, after it started: under a supervisor, the same
# traceback (`No module named 'psycopg'`) until the crash loop stopped everything.
DATABASE_SCHEME: Final = "postgresql+asyncpg"
DATABASE_URL_EXAMPLE: Final = f"{DATABASE_SCHEME}://user:password@host:5432/db"
# What is shown of a refused URL: its scheme only (the rest may hold a password).
_SCHEME: Final = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]{0,39}$")


def checked_database_url(url: str) -> str:
    """The URL when it names the asyncpg driver; otherwise a one-line refusal that names
    the form expected and the scheme given (never the rest of the URL)."""
    scheme, separator, _ = url.partition("://")
    if separator and scheme == DATABASE_SCHEME:
        return url
    given = f"{scheme}://..." if separator and _SCHEME.match(scheme) else "no scheme"
    raise PydanticCustomError(
        "database_url_driver",
        "must be {expected} (the asyncpg driver, the one ModelForge uses); this URL has {given}",
        {"expected": DATABASE_URL_EXAMPLE, "given": given},
    )


# A database URL setting: refused when it is read, in one line, by every command.
DatabaseUrl = Annotated[str, AfterValidator(checked_database_url)]


class DatabaseSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MODELFORGE_", extra="ignore")

    database_url: DatabaseUrl = Field(description=f"SQLAlchemy URL, {DATABASE_URL_EXAMPLE}")


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
