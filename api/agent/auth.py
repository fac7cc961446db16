"""Node authentication in the API process: the Authorization header, and the node cache.

The header is parsed here (a missing or malformed one is refused before the database is
read); admitting the credential is the store's rule, inside the request's transaction
(store/node_credentials.py). A node the node cache holds (api/node_cache.py) is admitted
without that read (`admit_cached`), and a new process fills its cache from the store's
live credentials in one read (`warm`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from api.errors import Unauthenticated
from api.node_cache import CachedNode, NodeCache, cache_entry
from schemas.admin import Liveness
from schemas.errors import ErrorCode
from schemas.protocol import HTTP_WHITESPACE, NODE_CREDENTIAL_PREFIX
from store import node_credentials, secrets
from store.node_credentials import AuthenticatedNode


def bearer_value(authorization: str | None) -> str:
    if not authorization:
        raise Unauthenticated("a node credential is required", code=ErrorCode.CREDENTIAL_MISSING)
    scheme, _, value = authorization.partition(" ")
    # Only what HTTP strips around a header value: str.strip() would also drop NEL
    # (U+0085) and other Unicode spaces, a second spelling of the same credential.
    value = value.strip(HTTP_WHITESPACE)
    if scheme.lower() != "bearer" or not value:
        raise Unauthenticated(
            "expected 'Authorization: Bearer <credential>'", code=ErrorCode.CREDENTIAL_MALFORMED
        )
    return value


def presented_credential(authorization: str | None) -> secrets.PresentedSecret | None:
    """The credential in an Authorization header, or None for anything else (the
    database path then gives the typed refusal)."""
    try:
        value = bearer_value(authorization)
    except Unauthenticated:
        return None
    return secrets.parse(NODE_CREDENTIAL_PREFIX, value)


def require_credential(authorization: str | None) -> secrets.PresentedSecret:
    """The credential in an Authorization header, or the typed 401 for a missing or
    malformed one, before anything waits for the database: under overload such a
    request is refused for what it is, not shed as if it were a node's."""
    return node_credentials.parse_presented(bearer_value(authorization))


async def authenticate_node(
    session: AsyncSession, authorization: str | None, *, serialize: bool = True
) -> AuthenticatedNode:
    """serialize=False skips the node lock; only for paths that usually emit nothing."""
    return await node_credentials.authenticate(
        session, bearer_value(authorization), serialize=serialize
    )


async def warm(
    cache: NodeCache,
    sessions: async_sessionmaker[AsyncSession],
    observe: Callable[[datetime], None],
    *,
    listening_within_s: float = 10.0,
) -> int:
    """Fill a new process's node cache from the database in one read, so that a fleet
    heartbeating at a restarted (or added) API is answered routinely from its first
    heartbeat instead of one transaction per node (the return storm); `observe` gets
    the database clock (the heartbeat buffer's, which the cache needs). Only what a
    request would admit is stored (store/node_credentials.py: live_online), as a
    committed heartbeat leaves it. The read is guarded like any other: a node changed
    while it ran is not stored. How many were stored; none while LISTEN is down (the
    cache holds nothing then)."""
    deadline = asyncio.get_running_loop().time() + listening_within_s
    while not cache.listening:
        if asyncio.get_running_loop().time() > deadline:
            return 0
        await asyncio.sleep(0.05)
    generation = cache.generation
    async with sessions() as session, session.begin():
        live, now = await node_credentials.live_online(session)
    if now is not None:
        observe(now)
    for credential in live:
        cache.remember(cache_entry(credential.node, credential.digest), generation)
    return len(cache)


def admit_cached(cached: CachedNode, received_at: datetime) -> AuthenticatedNode:
    """A node the node cache admitted (api/node_cache.py): online, credential live,
    enabled and not decommissioned as of the last notification; no lock taken."""
    return AuthenticatedNode(
        node_id=cached.node_id,
        credential_id=cached.credential_id,
        agent_version=cached.agent_version,
        protocol_version=cached.protocol_version,
        capabilities=list(cached.capabilities),
        liveness=Liveness.ONLINE.value,
        received_at=received_at,
        serialized=False,
    )
