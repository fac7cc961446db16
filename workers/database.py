"""The worker process's shared async database handle (one engine per process)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from broker.jetstream import AsyncResource
from store.engine import make_engine, make_sessionmaker


@dataclass(frozen=True)
class Database:
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]


def database_resource(database_url: str, pool_size: int) -> AsyncResource[Database]:
    """Opened on the actors' event loop at worker boot, disposed at shutdown
    (asyncpg connections belong to the loop that made them)."""

    async def open_database() -> Database:
        engine = make_engine(database_url, pool_size=pool_size)
        return Database(engine=engine, sessions=make_sessionmaker(engine))

    async def close_database(database: Database) -> None:
        await database.engine.dispose()

    return AsyncResource("database", open_database, close_database)
