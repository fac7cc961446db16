"""Broker settings, read from MODELFORGE_* environment variables by the process entry point."""

from __future__ import annotations

from nats.js.api import Placement
from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def nats_servers(url: str) -> list[str]:
    """MODELFORGE_NATS_URL as nats-py's server list: one URL or a comma-separated list
    of a cluster's servers (any of them is enough to reach the cluster; the client
    learns the others from the server and moves to one of them when its own is lost)."""
    servers = [part.strip() for part in url.split(",") if part.strip()]
    if not servers:
        raise ValueError("no NATS server URL given")
    return servers


class ReplicationSettings(BaseSettings):
    """Where JetStream keeps the streams a process declares (and, through them, their
    durable consumers, which inherit the stream's replicas). Every process that declares
    streams (workers, relays) must be given the same values: each declaration brings an
    existing stream to its own configuration."""

    model_config = SettingsConfigDict(env_prefix="MODELFORGE_", extra="ignore")

    # MODELFORGE_REPLICAS: 1 for a single server, 3 on a production cluster (every
    # stream then survives the loss of one server; 5 survives two).
    replicas: int = Field(default=1, ge=1, le=5)
    # MODELFORGE_PLACEMENT_CLUSTER / MODELFORGE_PLACEMENT_TAGS (comma-separated): put the
    # streams on that cluster of a supercluster and/or on servers carrying every tag
    # (nats-server `server_tags`). Unset: wherever the server picks.
    placement_cluster: str | None = None
    placement_tags: str = ""

    def placement(self) -> Placement | None:
        tags = [tag.strip() for tag in self.placement_tags.split(",") if tag.strip()]
        if self.placement_cluster is None and not tags:
            return None
        return Placement(cluster=self.placement_cluster, tags=tags or None)


class BrokerSettings(ReplicationSettings):
    """Everything build_broker() needs; nothing is read from the environment elsewhere."""

    model_config = SettingsConfigDict(env_prefix="MODELFORGE_", extra="ignore", frozen=True)

    # One URL or a comma-separated list of cluster seeds. Required: a default would
    # quietly reach whatever NATS listens on this host.
    nats_url: str
    # Prefix of every subject and stream this broker owns, so several deployments
    # (or test runs) can share one NATS account without seeing each other's work.
    namespace: str = Field(default="modelforge", pattern=r"^[a-z][a-z0-9_-]{0,31}$")
    # How long the server waits for an ack before redelivering. In-flight messages
    # are kept alive with +WPI every ack_wait/3, so this bounds how long a *dead*
    # worker's messages stay stuck, not how long an actor may run (see time_limit_ms).
    ack_wait_s: float = Field(default=30.0, gt=0)
    # dramatiq Retries: the only retry mechanism for failures (see factory.py).
    max_retries: int = Field(default=5, ge=0)
    min_backoff_ms: int = Field(default=1_000, gt=0)
    max_backoff_ms: int = Field(default=300_000, gt=0)
    # Safety net for crash loops (worker killed before ack): a message delivered more
    # often than this without being settled is dead-lettered instead of run again.
    max_deliveries: int = Field(default=10, ge=1)
    # Overrides the prefetch dramatiq's Worker asks for (2 x worker threads).
    prefetch: int | None = Field(default=None, ge=1)
    # TimeLimit middleware: hard bound on one actor run.
    time_limit_ms: int = Field(default=600_000, gt=0)
    # Server-side bound on unacked messages per queue across all workers. Messages
    # waiting for their ETA (nak with delay) count here too, so keep it well above
    # replicas x prefetch plus the number of scheduled retries you expect.
    max_ack_pending: int = Field(default=20_000, ge=1)
    # Nats-Msg-Id dedupe horizon on both streams.
    dedupe_window_s: float = Field(default=120.0, gt=0)
    dead_letter_max_age_s: float = Field(default=30 * 24 * 3600.0, gt=0)
    # Bound on every request/reply to the server (publish ack, ack_sync, API calls).
    api_timeout_s: float = Field(default=5.0, gt=0)
    # Bound on the first connection; after that the client reconnects forever.
    connect_timeout_s: float = Field(default=10.0, gt=0)
    # A message for an actor this process doesn't know (rolling deploy) is handed
    # back with this delay so a newer worker can take it; max_deliveries bounds it.
    unknown_actor_delay_s: float = Field(default=5.0, gt=0)
    # How often the metrics middleware refreshes consumer lag from consumer info.
    lag_refresh_s: float = Field(default=15.0, gt=0)

    @model_validator(mode="after")
    def _backoff_order(self) -> BrokerSettings:
        if self.min_backoff_ms > self.max_backoff_ms:
            raise ValueError("min_backoff_ms must not exceed max_backoff_ms")
        return self

    @property
    def servers(self) -> list[str]:
        return nats_servers(self.nats_url)
