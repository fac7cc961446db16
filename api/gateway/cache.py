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

While calls use the table it is kept fresh off their path (`keep_fresh`): read again once
it is half its age, and at most that long after a notification dropped it. Calls every
second or so, the common case, found it aged or dropped half the time before, and each of
those waited on the routes query on its way to the node: 3.8 ms against 0.08 ms for a
cached table (ops/bench/gateway.py's tools workload at 1 client; client to llama-server
p50 7.9 ms before, 6.1 ms after). A read begun by the call that found the table aged,
even as a task of its own, still ran on that call's path through the event loop. The
cost: up to two reads a second per API process while calls come, where the calls alone
made about one; a table nobody calls is not read.
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
from api.periodic import Outage, repeat, running
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
        # Whether a call asked for routes since keep_fresh last looked.
        self._used = False

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
        self._used = True
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
            return await self._read_table()

    async def _read_table(self) -> list[tuple[Route, float]]:
        """The table read now (the lock held), kept unless a notification overtook it."""
        began, read_at = self._table_generation, time.monotonic()
        read = await self._read_routes()
        table = [(route, _cool_until(route, read_at)) for route in read]
        if self.listening and began == self._table_generation:
            self._table, self._table_at = table, read_at
        return table

    def _fresh(self, now: float, max_age_s: float | None = None) -> bool:
        limit = self.routes_max_age_s if max_age_s is None else max_age_s
        return self.listening and now - self._table_at < limit

    async def keep_fresh(self, stop: asyncio.Event) -> None:
        """Until `stop`: `refresh` every half age. A read that fails is the calls' to
        make meanwhile, as without this task."""
        outage = Outage(logger, "the routing table", "is read ahead again")
        half = self.routes_max_age_s / 2
        await repeat(self.refresh, stop, half, outage, after_stop=False, what="not read ahead")

    async def refresh(self) -> bool:
        """If calls asked for routes since the last look: read the table again when it is
        half its age or was dropped, so that a call finds it fresh. Whether it read."""
        if not (self._used and self.listening):
            return False
        self._used = False
        async with self._table_lock:
            half = self.routes_max_age_s / 2
            if self._table is not None and self._fresh(time.monotonic(), half):
                return False
            await self._read_table()
            return True

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
    async with (
        kept_by_listen(database_url, GATEWAY_CHANGES_CHANNEL, cache),
        running(cache.keep_fresh, "gateway-routes"),
    ):
        yield cache
