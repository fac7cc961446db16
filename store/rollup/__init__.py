"""The control plane's per-minute rollup (migration 0019): the gateway's usage per
service client and model, the fleet's counts and each node's telemetry, kept in
PostgreSQL for a bounded time so the overview, the usage views and the CLI read their
history without Prometheus."""
