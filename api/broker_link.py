"""The API's NATS connection, for the few admin routes that manage the worker broker.

Opened on first use, not at start-up: agent traffic and every other route work while
NATS is down; only the dead-letter routes answer 503 then.
"""

from __future__ import annotations

import asyncio
import logging

import nats
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext

from api.errors import ServiceUnavailable
from broker.jetstream.settings import nats_servers

logger = logging.getLogger("modelforge.api.broker")


async def _quiet(error: Exception) -> None:
    # nats-py's default logs each failed attempt with a traceback (a cluster member that
    # is down, on every connect that tries it); the callers report the outcome.
    logger.debug("nats: %s", error)


class BrokerLink:
    def __init__(self, nats_url: str, *, timeout_s: float = 5.0) -> None:
        self._url = nats_url
        self._timeout_s = timeout_s
        self._nc: NatsClient | None = None
        self._lock = asyncio.Lock()

    @property
    def timeout_s(self) -> float:
        return self._timeout_s

    async def jetstream(self) -> JetStreamContext:
        async with self._lock:
            if self._nc is None or not self._nc.is_connected:
                await self._close()
                try:
                    self._nc = await asyncio.wait_for(
                        nats.connect(
                            servers=nats_servers(self._url),
                            allow_reconnect=False,
                            max_reconnect_attempts=1,
                            connect_timeout=self._timeout_s,
                            name="modelforge-api",
                            error_cb=_quiet,
                        ),
                        self._timeout_s * 2,
                    )
                except (OSError, TimeoutError, nats.errors.Error) as exc:
                    raise ServiceUnavailable(
                        f"NATS is unreachable ({type(exc).__name__})"
                    ) from None
            return self._nc.jetstream(timeout=self._timeout_s)

    async def ping(self, timeout_s: float) -> bool:
        """True when NATS answers a round trip within timeout_s (for /readyz)."""
        try:
            await asyncio.wait_for(self._ping(), timeout_s)
        except (ServiceUnavailable, OSError, TimeoutError, nats.errors.Error):
            return False
        return True

    async def _ping(self) -> None:
        await self.jetstream()
        assert self._nc is not None
        await self._nc.flush(timeout=max(1, round(self._timeout_s)))

    async def _close(self) -> None:
        nc, self._nc = self._nc, None
        if nc is not None:
            await nc.close()

    async def close(self) -> None:
        async with self._lock:
            await self._close()
