"""One NATS connection per broker: reconnects forever once established."""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import urlsplit

from nats.aio.client import Client as NatsClient

from broker.jetstream.settings import BrokerSettings

logger = logging.getLogger(__name__)

# Seconds between reconnect attempts to one server; short, because workers idle while
# disconnected and the server-side ack timers keep running.
RECONNECT_WAIT_S = 1.0


def redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.username or parts.password:
        host = parts.hostname or ""
        if parts.port:
            host += f":{parts.port}"
        return parts._replace(netloc=f"***@{host}").geturl()
    return url


async def connect(settings: BrokerSettings, client_name: str) -> NatsClient:
    """Connect within settings.connect_timeout_s, then reconnect forever on loss.

    A worker must outlive NATS restarts and leader changes: while disconnected its
    fetches time out (workers idle), and nats-py buffers acks and publishes until the
    connection is back. Giving up would strand every in-flight message until ack_wait.
    """
    servers = settings.servers

    async def on_error(exc: Exception) -> None:
        logger.warning("nats: %s", exc)

    async def on_disconnected() -> None:
        if not (nc.is_closed or nc.is_draining):
            logger.warning("nats: disconnected")

    async def on_reconnected() -> None:
        logger.info("nats: reconnected to %s", redact(str(nc.connected_url or "")))

    nc = NatsClient()
    try:
        await asyncio.wait_for(
            nc.connect(
                servers=servers,
                name=client_name,
                allow_reconnect=True,
                max_reconnect_attempts=-1,
                reconnect_time_wait=RECONNECT_WAIT_S,  # type: ignore[arg-type]
                connect_timeout=max(1, int(settings.connect_timeout_s)),
                error_cb=on_error,
                disconnected_cb=on_disconnected,
                reconnected_cb=on_reconnected,
            ),
            timeout=settings.connect_timeout_s,
        )
    except BaseException:
        await nc.close()
        raise
    logger.info(
        "nats: connected to %s (server %s)",
        ", ".join(redact(s) for s in servers),
        nc.connected_server_version,
    )
    return nc
