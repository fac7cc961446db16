"""Worker process settings (outbox relay for now), read in main()."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from broker.jetstream.settings import ReplicationSettings
from broker.streams import StreamSpec, events_stream
from store.services.replicas import ServicePolicy
from store.settings import DatabaseUrl, LeaseSettings
from workers.rollup import RollupSettings


class RelaySettings(ReplicationSettings):
    """The relay and the event consumers; the events stream's replicas and placement
    (MODELFORGE_REPLICAS, MODELFORGE_PLACEMENT_*) are the broker's, read from the same
    variables."""

    model_config = SettingsConfigDict(env_prefix="MODELFORGE_", extra="ignore")

    database_url: DatabaseUrl
    # Required: see ApiSettings.nats_url.
    nats_url: str
    relay_batch_size: int = Field(default=200, gt=0)
    # The relay wakes when an outbox insert commits (LISTEN/NOTIFY); this poll is only
    # the fallback for a notification missed while its connection was re-established.
    relay_poll_interval_s: float = Field(default=1.0, gt=0)
    log_level: str = "INFO"

    def events_stream(self) -> StreamSpec:
        return events_stream(self.replicas, self.placement())


class WorkerSettings(RelaySettings, LeaseSettings, RollupSettings):
    """`modelforge worker`: the actors, the liveness ticker and the outbox relay.

    Broker settings (ack wait, retries, dead letters) are BrokerSettings, read beside it.
    """

    stale_after_s: float = Field(default=30.0, gt=0)
    offline_after_s: float = Field(default=90.0, gt=0)
    # How often a liveness sweep is scheduled: a transition lands within about this
    # long after its threshold passes.
    sweep_period_s: float = Field(default=0.5, gt=0)
    # Fleet safety (store/fleet.py); the presence settings must match the API's.
    restart_grace_s: float = Field(default=30.0, ge=0)
    presence_gap_s: float | None = Field(default=None, gt=0)
    # The partition breaker: more than this share of the watched nodes silent at once
    # holds offline transitions (at least partition_min_nodes watched).
    partition_share: float = Field(default=0.3, gt=0, lt=1)
    partition_min_nodes: int = Field(default=10, ge=1)
    db_pool_size: int = Field(default=5, gt=0)
    # Prometheus metrics on this port (+ the process index with --processes N); 0: off.
    metrics_port: int = Field(default=9464, ge=0, lt=65536)
    metrics_host: str = "127.0.0.1"
    # False: this worker runs actors only (e.g. scale the relay separately).
    run_relay: bool = True
    # The audit and reconcile consumers of the event stream (workers/pipeline.py).
    run_consumers: bool = True
    consumer_batch_size: int = Field(default=200, gt=0)
    # An event a worker took and did not ack (it died) goes to another one after this.
    consumer_ack_wait_s: float = Field(default=30.0, gt=0)
    # Lease expiry (workers/leases.py) is scheduled this often.
    lease_sweep_period_s: float = Field(default=1.0, gt=0)
    # The deployment reconciler (workers/deployments.py).
    deployment_sweep_period_s: float = Field(default=2.0, gt=0)
    # The service reconciler (workers/service_reconcile.py): its period, how long a
    # replica may be unavailable before a replacement is placed, the placements one
    # service gets per step, and the backoff off a node where a replica failed.
    service_sweep_period_s: float = Field(default=2.0, gt=0)
    service_heal_grace_s: float = Field(default=30.0, ge=0)
    service_placements_per_step: int = Field(default=16, ge=1, le=1000)
    service_backoff_base_s: float = Field(default=10.0, ge=0)
    service_backoff_max_s: float = Field(default=600.0, ge=0)
    # A replica's job queued and never claimed this long (its node online) goes elsewhere.
    service_claim_timeout_s: float = Field(default=300.0, gt=0)
    # Published outbox events are kept this long (the admin event stream's resume reads
    # them back), then deleted by a prune scheduled every outbox_prune_period_s.
    outbox_retention_s: float = Field(default=7 * 24 * 3600.0, gt=0)
    outbox_prune_period_s: float = Field(default=60.0, gt=0)
    # A start that finds JetStream unable to answer (no quorum, a leader election) is
    # retried after a full-jitter wait whose bound doubles from the first to the last.
    jetstream_wait_initial_s: float = Field(default=0.5, gt=0)
    jetstream_wait_max_s: float = Field(default=10.0, gt=0)

    def service_policy(self) -> ServicePolicy:
        return ServicePolicy(
            heal_grace_s=self.service_heal_grace_s,
            max_placements_per_step=self.service_placements_per_step,
            backoff_base_s=self.service_backoff_base_s,
            backoff_max_s=self.service_backoff_max_s,
            claim_timeout_s=self.service_claim_timeout_s,
        )
