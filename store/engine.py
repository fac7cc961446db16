"""Async engine and session factory, created by whoever owns the process lifecycle."""

from __future__ import annotations

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)


def make_engine(database_url: str, *, pool_size: int = 10) -> AsyncEngine:
    return create_async_engine(
        database_url,
        pool_size=pool_size,
        max_overflow=pool_size,
        # No pre-ping: it costs a round trip on every checkout of the heartbeat hot
        # path; a connection broken by a database restart fails one request and is
        # discarded by the pool.
        pool_recycle=1800,
        # Timestamps are compared in UTC everywhere; never depend on the server's zone.
        connect_args={"server_settings": {"timezone": "UTC"}},
    )


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


def database_down(exc: BaseException) -> bool:
    """A lost or refused database connection, not a fault of the statement: worth a
    retry later (workers) or a 503 (the API), never a 500."""
    if isinstance(exc, ConnectionError):  # asyncpg raises a refused connect as it is
        return True
    if isinstance(exc, DBAPIError):
        return exc.connection_invalidated or isinstance(exc, OperationalError | InterfaceError)
    return False
