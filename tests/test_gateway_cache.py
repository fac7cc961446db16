"""The gateway's cache (api/gateway/cache.py): admitted service clients and the routing
table, dropped by their notifications, never storing a read a notification overtook,
and holding nothing while LISTEN is down.

These drive the cache's own notification entry points in process (its reads are a
counting stand-in for the routes query); over real PostgreSQL, the refusal of a revoked
or rotated client across two API processes, and by the process that changed it with
every NOTIFY held back, are tests/test_service_clients.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from api.gateway.cache import GatewayCache
from api.gateway.scope import ClientScope
from store import secrets
from store.deployments.routing import Route

pytestmark = pytest.mark.fast


def _client() -> tuple[ClientScope, secrets.PresentedSecret, bytes]:
    presented = secrets.PresentedSecret(id=uuid.uuid4(), secret="s3cret-" + uuid.uuid4().hex)
    scope = ClientScope(
        client_id=presented.id,
        name="svc",
        models=frozenset({"smol"}),
        roles=frozenset(),
        max_concurrent=None,
        rate_per_minute=None,
    )
    return scope, presented, secrets.digest(presented.secret)


def _route(model: str = "smol", cooldown_left_s: float = 0.0) -> Route:
    return Route(
        deployment_id=uuid.uuid4(),
        node_id=uuid.uuid4(),
        device_id="cpu",
        model=model,
        roles=("planner",),
        queue_depth=0,
        max_concurrent=4,
        cooling=cooldown_left_s > 0,
        cooldown_left_s=cooldown_left_s,
        time_to_first_token_s=None,
        generation_tokens_per_s=None,
    )


class Table:
    """The routes 'in the database', and how often they were read."""

    def __init__(self, *routes: Route) -> None:
        self.routes = list(routes)
        self.reads = 0

    async def read(self) -> list[Route]:
        self.reads += 1
        return list(self.routes)


def _listening(table: Table | None = None, max_age_s: float = 60.0) -> GatewayCache:
    cache = GatewayCache((table or Table()).read, routes_max_age_s=max_age_s)
    cache._on_connected(True)
    return cache


def test_an_admitted_client_is_answered_from_the_cache_with_its_own_secret_only() -> None:
    cache = _listening()
    scope, presented, digest = _client()
    cache.remember_client(digest, scope, cache.generation)
    assert cache.client(presented) == scope
    wrong = secrets.PresentedSecret(id=presented.id, secret="not-it")
    assert cache.client(wrong) is None


def test_a_read_overtaken_by_its_clients_notification_is_not_stored() -> None:
    cache = _listening()
    scope, presented, digest = _client()
    began = cache.generation
    cache._on_payload(f"c:{scope.client_id}")  # a revocation committed while the read ran
    cache.remember_client(digest, scope, began)
    assert cache.client(presented) is None
    cache.remember_client(digest, scope, cache.generation)
    assert cache.client(presented) == scope
    # Its next notification drops it.
    cache._on_payload(f"c:{scope.client_id}")
    assert cache.client(presented) is None


def test_other_clients_and_deployments_do_not_keep_a_read_out() -> None:
    cache = _listening()
    scope, presented, digest = _client()
    began = cache.generation
    cache._on_payload(f"c:{uuid.uuid4()}")
    cache._on_payload(f"d:{uuid.uuid4()}")
    cache.remember_client(digest, scope, began)
    assert cache.client(presented) == scope


def test_nothing_is_cached_while_not_listening_and_a_reconnect_starts_empty() -> None:
    cache = GatewayCache(Table().read)
    scope, presented, digest = _client()
    cache.remember_client(digest, scope, cache.generation)
    assert cache.client(presented) is None
    cache._on_connected(True)
    cache.remember_client(digest, scope, cache.generation)
    assert cache.client(presented) == scope
    cache._on_connected(False)
    assert cache.client(presented) is None
    cache._on_connected(True)
    assert cache.client(presented) is None


def test_an_unreadable_payload_clears_everything() -> None:
    cache = _listening()
    scope, presented, digest = _client()
    cache.remember_client(digest, scope, cache.generation)
    cache._on_payload("c:not-a-uuid")
    assert cache.client(presented) is None


async def test_the_table_is_read_once_until_a_deployment_changes() -> None:
    smol, other = _route("smol"), _route("other")
    table = Table(smol, other)
    cache = _listening(table)
    assert await cache.routes("smol") == [smol]
    assert await cache.routes("planner") == [smol, other]  # a role both serve
    assert await cache.routes("other") == [other]
    assert table.reads == 1
    cache._on_payload(f"d:{smol.deployment_id}")
    table.routes = [other]
    assert await cache.routes("smol") == []
    assert table.reads == 2


class Overtaken(Table):
    """A table whose `at`-th read is overtaken by a notification of `notified`,
    committed while it ran."""

    def __init__(self, at: int, notified: Route, *routes: Route) -> None:
        super().__init__(*routes)
        self.at, self.notified = at, notified
        self.cache: GatewayCache | None = None

    async def read(self) -> list[Route]:
        routes = await super().read()
        if self.reads == self.at and self.cache is not None:
            self.cache._on_payload(f"d:{self.notified.deployment_id}")
        return routes


def _overtaken(at: int, route: Route, max_age_s: float = 60.0) -> tuple[Overtaken, GatewayCache]:
    table = Overtaken(at, route, route)
    table.cache = _listening(table, max_age_s)
    return table, table.cache


async def test_a_table_read_overtaken_by_a_notification_is_answered_but_not_kept() -> None:
    smol = _route()
    table, cache = _overtaken(1, smol)
    assert await cache.routes("smol") == [smol]
    assert await cache.routes("smol") == [smol]
    assert table.reads == 2  # the first read was not kept
    assert await cache.routes("smol") == [smol]
    assert table.reads == 2


async def test_the_table_ages_out_and_a_burst_reads_it_once() -> None:
    table = Table(_route())
    cache = _listening(table, max_age_s=0.05)
    await asyncio.gather(*(cache.routes("smol") for _ in range(20)))
    assert table.reads == 1
    deadline = asyncio.get_running_loop().time() + 5
    while table.reads == 1:
        assert asyncio.get_running_loop().time() < deadline, "the table never aged out"
        await cache.routes("smol")
        await asyncio.sleep(0.01)


class Readers(Table):
    """Also who read it: the keep_fresh task, or a call."""

    def __init__(self, *routes: Route) -> None:
        super().__init__(*routes)
        self.by_calls = 0

    async def read(self) -> list[Route]:
        task = asyncio.current_task()
        if task is None or task.get_name() != "keep-fresh":
            self.by_calls += 1
        return await super().read()


@contextlib.asynccontextmanager
async def _kept_fresh(cache: GatewayCache) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(cache.keep_fresh(stop), name="keep-fresh")
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)


async def _until(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + 10
    while not await condition():
        assert asyncio.get_running_loop().time() < deadline, f"never: {what}"
        await asyncio.sleep(0.01)


async def test_a_table_in_use_is_read_again_before_a_call_would_wait_for_it() -> None:
    old, new = _route(), _route()
    table = Readers(old)
    # Half the age is 0.5 s: only a stall of the event loop that long makes a call read.
    cache = _listening(table, max_age_s=1.0)
    async with _kept_fresh(cache):
        assert await cache.routes("smol") == [old]
        table.routes = [new]

        async def changed() -> bool:
            return await cache.routes("smol") == [new]

        await _until(changed, "the new table read ahead")
        # Read again while in use, and the calls found it fresh every time.
        assert table.reads >= 2
        assert table.by_calls == 1


async def test_a_dropped_table_in_use_is_read_again_before_a_call_needs_it() -> None:
    old, new = _route(), _route()
    table = Readers(old)
    cache = _listening(table)
    assert await cache.routes("smol") == [old]
    table.routes = [new]
    cache._on_payload(f"d:{old.deployment_id}")
    await cache.refresh()
    assert table.reads == 2
    assert await cache.routes("smol") == [new]
    assert table.reads == 2  # the call found it fresh


async def test_a_table_nobody_called_since_the_last_look_is_not_read() -> None:
    table = Readers(_route())
    cache = _listening(table, max_age_s=1e-9)  # always past half its age
    await cache.refresh()
    assert table.reads == 0  # never asked for
    await cache.routes("smol")
    await cache.refresh()
    assert table.reads == 2  # asked for since: read ahead
    await cache.refresh()
    assert table.reads == 2  # not since


async def test_a_read_ahead_overtaken_by_a_notification_is_not_kept() -> None:
    old, new = _route(), _route()
    table, cache = _overtaken(2, old, max_age_s=1e-9)
    assert await cache.routes("smol") == [old]
    table.routes = [new]
    await cache.refresh()
    assert table.reads == 2
    assert await cache.routes("smol") == [new]
    assert table.reads == 3  # the read ahead was not kept: the call read


async def test_a_cooldown_is_counted_on_this_process_clock() -> None:
    cooling, fresh = _route(cooldown_left_s=30.0), _route(cooldown_left_s=0.0)
    cache = _listening(Table(cooling, fresh))
    by_id = {route.deployment_id: route for route in await cache.routes("smol")}
    assert by_id[cooling.deployment_id].cooling is True
    assert by_id[fresh.deployment_id].cooling is False


async def test_while_not_listening_every_call_reads_the_database() -> None:
    table = Table(_route())
    cache = GatewayCache(table.read)
    await cache.routes("smol")
    await cache.routes("smol")
    assert table.reads == 2
