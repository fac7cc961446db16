"""API process settings, read from MODELFORGE_* environment variables in main()."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from schemas.hub import HUB_URL
from store.liveness import presence_gap
from store.settings import DatabaseUrl, LeaseSettings


class ApiSettings(LeaseSettings):
    model_config = SettingsConfigDict(env_prefix="MODELFORGE_", extra="ignore")

    database_url: DatabaseUrl = Field(description="SQLAlchemy URL, postgresql+asyncpg://...")
    # Required, like the database: a default would quietly reach whatever NATS listens
    # on this host's 4222, which is often not ours.
    nats_url: str
    # Unset or empty: every admin route refuses (fail closed).
    operator_api_key: SecretStr | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    heartbeat_interval_s: float = Field(default=10.0, gt=0)
    stale_after_s: float = Field(default=30.0, gt=0)
    offline_after_s: float = Field(default=90.0, gt=0)
    future_skew_limit_s: float = Field(default=300.0, ge=0)
    # Restart grace (store/fleet.py): every API process refreshes its presence this
    # often; no refresh for presence_gap_s is an outage, and heartbeats that predate it
    # count from its end plus restart_grace_s. The workers read the same two settings.
    presence_period_s: float = Field(default=1.0, gt=0)
    # None: 5 s, at most a third of STALE_AFTER_S (store/liveness.py). Every API process
    # and worker must use the same value.
    presence_gap_s: float | None = Field(default=None, gt=0)
    restart_grace_s: float = Field(default=30.0, ge=0)
    max_body_bytes: int = Field(default=1_048_576, gt=0)
    # Idle keep-alive connections stay open this long: longer than an agent's heartbeat
    # interval and than its client's keep-alive expiry (20 s), so agents reuse one
    # connection and it is always the client that closes an idle one.
    keep_alive_s: float = Field(default=30.0, gt=0)
    db_pool_size: int = Field(default=10, gt=0)
    # Load shedding (api/shedding.py): past this many node requests of one process in
    # flight on the transactional path, heartbeats of uncached nodes, inventory and
    # telemetry are answered 429 with Retry-After (spread up to a heartbeat interval)
    # until half of them drained. 0: never shed.
    shed_in_flight: int = Field(default=256, ge=0)
    # Routine heartbeats skip the database (api/node_cache.py, api/heartbeat_buffer.py):
    # their timestamps are written together every heartbeat_flush_interval_s (None:
    # 0.25 s, at most a tenth of STALE_AFTER_S; at most a quarter of it if set). A crash
    # loses at most that interval of timestamps. The same cache admits telemetry and
    # inventory without the credential read and node lock (api/deps.py). False: every
    # agent request authenticates against the database, every heartbeat is one
    # transaction (the path before the cache; kept for comparison and diagnosis).
    heartbeat_cache: bool = True
    # How long a starting process waits for its node cache to be warmed before it
    # serves: a fleet returning to a restarted API is then answered from the cache from
    # its first heartbeat. Past it, the process serves anyway and the warm goes on.
    node_cache_warm_wait_s: float = Field(default=10.0, ge=0)
    heartbeat_flush_interval_s: float | None = Field(default=None, gt=0)
    log_level: str = "INFO"
    # One log line per request (method, path, status, duration): off by default, since a
    # fleet's heartbeats would bury everything else; its traffic is on /metrics.
    access_log: bool = False
    # /readyz answers 503 when the relay is this far behind (events stall: no worker
    # runs, or NATS refuses them).
    ready_outbox_backlog_max: int = Field(default=10_000, gt=0)
    ready_outbox_lag_max_s: float = Field(default=30.0, gt=0)
    # Set by `modelforge up` (MODELFORGE_SUPERVISOR_STATE_FILE): its supervisor's state
    # file, whose failing children /readyz names (schemas/stack.py). Unset: none.
    supervisor_state_file: Path | None = None
    # The worker broker's namespace (BrokerSettings.namespace): where the admin API
    # finds the dead-letter stream.
    broker_namespace: str = "modelforge"
    # TLS with a private CA (ops/pki/mint.py): the server's certificate and key, and
    # optionally the CA whose client certificates are then required of every client.
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_client_ca_file: str | None = None
    # The notification channel (api/agent/notifications.py) re-authenticates its node
    # at every keep-alive: a revoked, disabled or decommissioned node's channel closes
    # within this. Below the agent's read timeout for the channel (40 s).
    notification_keepalive_s: float = Field(default=15.0, gt=0, lt=40)
    # Server-resolved artifact manifests (api/manifests.py): a Hub-layout source.
    artifact_source_url: str = HUB_URL
    artifact_source_token: SecretStr | None = None
    # A service's memory estimate reads its GGUF's header from the same source
    # (api/model_headers.py): at most this many bytes of the file's start, each read
    # within this time; past either, the estimate is the file's size.
    model_header_timeout_s: float = Field(default=10.0, gt=0)
    model_header_max_bytes: int = Field(default=32 * 1024 * 1024, gt=0)
    # The gateway (api/gateway/). Time to first token and the gap between tokens are
    # separate bounds, so a slow prefill is not taken for a hang.
    gateway_first_token_timeout_s: float = Field(default=60.0, gt=0)
    gateway_token_gap_timeout_s: float = Field(default=30.0, gt=0)
    # How long a runtime channel may take to take an invoke (a NATS request).
    gateway_delivery_timeout_s: float = Field(default=2.0, gt=0)
    # Deployments tried per request, before the first byte reached the client.
    gateway_attempts: int = Field(default=3, ge=1, le=10)
    # How long the gateway's routing table is trusted without a notification: node
    # liveness and probe evidence do not notify it (api/gateway/cache.py).
    gateway_routes_max_age_s: float = Field(default=1.0, gt=0, le=60)
    # A deployment that failed or timed out an invoke is not routed to for this long.
    gateway_cooldown_s: float = Field(default=10.0, ge=0)
    # A token bound for a request that names none.
    gateway_default_max_tokens: int = Field(default=512, ge=1, le=8192)
    # How often this process writes its measurements per served model (autoscale's
    # input, api/gateway/measurements.py): well inside the read side's staleness bound
    # (store/services/measurements.py: FRESH_S, 30 s).
    gateway_measure_interval_s: float = Field(default=5.0, gt=0, le=10)

    @property
    def gap_s(self) -> float:
        return presence_gap(self.presence_gap_s, self.stale_after_s)

    @property
    def heartbeat_flush_s(self) -> float:
        if self.heartbeat_flush_interval_s is not None:
            return self.heartbeat_flush_interval_s
        return min(0.25, self.stale_after_s / 10)

    @property
    def beat_period_s(self) -> float:
        # At least two beats per gap, so one late beat is not an outage.
        return min(self.presence_period_s, self.gap_s / 2)

    @model_validator(mode="after")
    def _flush_well_inside_stale(self) -> ApiSettings:
        flush = self.heartbeat_flush_interval_s
        if flush is not None and flush > self.stale_after_s / 4:
            raise ValueError(
                "MODELFORGE_HEARTBEAT_FLUSH_INTERVAL_S must be at most a quarter of"
                " MODELFORGE_STALE_AFTER_S: a crash loses that much heartbeat time"
            )
        return self

    @model_validator(mode="after")
    def _tls_complete(self) -> ApiSettings:
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("set both MODELFORGE_TLS_CERT_FILE and MODELFORGE_TLS_KEY_FILE")
        if self.tls_client_ca_file and not self.tls_cert_file:
            raise ValueError("MODELFORGE_TLS_CLIENT_CA_FILE needs the server certificate too")
        return self

    def uvicorn_tls(self) -> dict[str, Any]:
        """uvicorn's TLS arguments; empty when TLS is off."""
        if not self.tls_cert_file:
            return {}
        options: dict[str, Any] = {
            "ssl_certfile": self.tls_cert_file,
            "ssl_keyfile": self.tls_key_file,
        }
        if self.tls_client_ca_file:
            options |= {"ssl_ca_certs": self.tls_client_ca_file, "ssl_cert_reqs": ssl.CERT_REQUIRED}
        return options

    @property
    def admin_enabled(self) -> bool:
        return bool(self.operator_api_key and self.operator_api_key.get_secret_value())
