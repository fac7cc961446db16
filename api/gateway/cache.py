"""What one API process's gateway remembers, so that a chat completion needs no database
transaction on its way to the node: the service clients it admitted (their secret's
digest and scope) and the routing table (every ready deployment, api/gateway/routing.py
orders them).

Kept true by LISTEN, as the node cache is (api/node_cache.py, whose reasoning holds here):
* every change to a service client or a deployment NOTIFYs when it commits (migration
  0011), and the client's entry, or the whole table, is dropped in every API process
  within milliseconds; so a revoked or rotated secret is refused everywhere well inside a
  second;
* the process that rotates or revokes a client drops it right after its commit, before
  it answers (store/session_notes.py, api/deps.py), not when its own NOTIFY comes back;
* a read that began before a notification of what it read is never stored (per client;
  the table has a generation of its own);
* while the LISTEN connection is down nothing is cached and every call reads the database.

The table also ages out after `routes_max_age_s`: node liveness and probe evidence, which
it joins, do not notify this channel. A stale table only ever costs a try: the runtime
worker checks every invoke again (loaded, not draining, below its bound), and a node gone
away has no channel to take it. An empty answer is never trusted: the caller asks the
database before answering 404 or 503 (api/gateway/call.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from api.cache_guard import ChangeGuard, kept_by_listen
from api.gateway.scope import ClientScope
from schemas.endpoints import Endpoint
from store import secrets
from store.deployments import routing as deployment_routes
from store.deployments.routing import Route
from store.notify import GATEWAY_CHANGES_CHANNEL

logger = logging.getLogger("modelforge.api.gateway")

ReadRoutes = Callable[[], Awaitable[list[Route]]]


def _cool_until(route: Route, read_at: float) -> float:
    """When its cooldown ends on this process's clock (0: none)."""
    return read_at + route.cooldown_left_s if route.cooldown_left_s > 0 else 0.0


@dataclass(frozen=True)
class _CachedClient:
    digest: bytes
    scope: ClientScope


class GatewayCache:
    def __init__(
        self, read_routes: ReadRoutes, *, routes_max_age_s: float = 1.0, max_clients: int = 100_000
    ) -> None:
        self._read_routes = read_routes
        self.routes_max_age_s = routes_max_age_s
        self._max_clients = max_clients
        self.listening = False
        self.closing = False
        self._guard = ChangeGuard(max_clients)
        self._clients: dict[uuid.UUID, _CachedClient] = {}
        self._table: list[tuple[Route, float]] | None = None
        self._table_at = 0.0
        self._table_generation = 0
        self._table_lock = asyncio.Lock()

    @property
    def generation(self) -> int:
        return self._guard.generation

    # ------------------------------------------------------------------ service clients

    def client(self, presented: secrets.PresentedSecret) -> ClientScope | None:
        """The scope when the presented secret matches a cached client (constant time);
        otherwise None, and the caller asks the database, which gives every refusal."""
        if not self.listening:
            return None
        entry = self._clients.get(presented.id)
        if entry is None or not secrets.matches(presented.secret, entry.digest):
            return None
        return entry.scope

    def remember_client(self, digest: bytes, scope: ClientScope, generation: int) -> None:
        """Store what a read that began at `generation` admitted, unless the client
        changed since."""
        if not self.listening or not self._guard.admits(scope.client_id, generation):
            return
        if len(self._clients) >= self._max_clients and scope.client_id not in self._clients:
            return
        self._clients[scope.client_id] = _CachedClient(digest, scope)

    def forget_client(self, client_id: uuid.UUID) -> None:
        self._guard.changed(client_id)
        self._clients.pop(client_id, None)

    # ------------------------------------------------------------------ the routing table

    async def routes(self, name: str, endpoint: Endpoint = "chat") -> list[Route]:
        """The ready deployments of a model or role that serve the endpoint, cooling
        recomputed for now."""
        now = time.monotonic()
        table = await self._current(now)
        return [
            dataclasses.replace(route, cooling=now < cool_until)
            for route, cool_until in table
            if (route.model == name or name in route.roles) and endpoint in route.endpoints
        ]

    def forget_routes(self) -> None:
        self._table_generation += 1
        self._table = None

    async def _current(self, now: float) -> list[tuple[Route, float]]:
        if self._fresh(now) and self._table is not None:
            return self._table
        if not self.listening:
            return [(route, _cool_until(route, now)) for route in await self._read_routes()]
        async with self._table_lock:
            # Whoever held the lock may have just read it: one read for a burst.
            if self._fresh(time.monotonic()) and self._table is not None:
                return self._table
            began, read_at = self._table_generation, time.monotonic()
            read = await self._read_routes()
            table = [(route, _cool_until(route, read_at)) for route in read]
            if self.listening and began == self._table_generation:
                self._table, self._table_at = table, read_at
            return table

    def _fresh(self, now: float) -> bool:
        return self.listening and now - self._table_at < self.routes_max_age_s

    # ------------------------------------------------------------------ notifications

    def _on_payload(self, payload: str) -> None:
        kind, _, raw = payload.partition(":")
        if kind == "d":
            self.forget_routes()
            return
        try:
            client_id = uuid.UUID(raw)
        except ValueError:
            self._clear()
            return
        if kind == "c":
            self.forget_client(client_id)
        else:
            self._clear()

    def _on_connected(self, up: bool) -> None:
        self._clear()
        self.listening = up
        if not up and not self.closing:
            logger.warning("gateway change notifications lost: its cache is off until back")

    def _clear(self) -> None:
        self._guard.clear()
        self._clients.clear()
        self.forget_routes()


def database_routes(sessions: async_sessionmaker[AsyncSession]) -> ReadRoutes:
    """The whole routing table, read in one short transaction."""

    async def read() -> list[Route]:
        async with sessions() as session, session.begin():
            return await deployment_routes.routes(session, endpoint=None)

    return read


@contextlib.asynccontextmanager
async def gateway_cache(
    database_url: str, read_routes: ReadRoutes, *, routes_max_age_s: float = 1.0
) -> AsyncIterator[GatewayCache]:
    """A cache kept true by LISTEN, for the lifespan of the API process."""
    cache = GatewayCache(read_routes, routes_max_age_s=routes_max_age_s)
    async with kept_by_listen(database_url, GATEWAY_CHANGES_CHANNEL, cache):
        yield cache
