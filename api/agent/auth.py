"""Node bearer-credential authentication, inside the request's transaction."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Row, Select, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from api.errors import ApiError, Forbidden, Unauthenticated
from api.node_cache import CachedNode, NodeCache
from schemas.admin import Liveness
from schemas.errors import ErrorCode
from schemas.protocol import NODE_CREDENTIAL_PREFIX
from store import secrets
from store.locks import node_xact_lock
from store.models import Node, NodeCredential


@dataclass(frozen=True)
class AuthenticatedNode:
    node_id: uuid.UUID
    credential_id: uuid.UUID
    agent_version: str
    protocol_version: int
    capabilities: list[str]
    # Recorded liveness (store/liveness.py), not the computed one.
    liveness: str
    # Database clock at authentication: the server-received time of this request.
    received_at: datetime
    # True once this transaction holds the node's event lock (store/locks.py).
    serialized: bool

    def require_owns(self, claimed_node_id: uuid.UUID) -> None:
        if claimed_node_id != self.node_id:
            raise Forbidden(
                "the credential belongs to a different node", code=ErrorCode.NODE_MISMATCH
            )


def bearer_value(authorization: str | None) -> str:
    if not authorization:
        raise Unauthenticated("a node credential is required", code=ErrorCode.CREDENTIAL_MISSING)
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise Unauthenticated(
            "expected 'Authorization: Bearer <credential>'", code=ErrorCode.CREDENTIAL_MALFORMED
        )
    return value.strip()


def presented_credential(authorization: str | None) -> secrets.PresentedSecret | None:
    """The credential in an Authorization header, or None for anything else (the
    database path then gives the typed refusal)."""
    try:
        value = bearer_value(authorization)
    except Unauthenticated:
        return None
    return secrets.parse(NODE_CREDENTIAL_PREFIX, value)


async def _lock_node_of(session: AsyncSession, credential_id: uuid.UUID) -> None:
    # A credential's node never changes, so reading it before the lock is safe.
    await session.execute(
        select(node_xact_lock(NodeCredential.node_id)).where(NodeCredential.id == credential_id)
    )


def _credentials() -> Select[*tuple[Any, ...]]:
    """What admitting a credential reads: the credential, its node, the database clock."""
    return select(
        NodeCredential.id.label("credential_id"),
        NodeCredential.digest,
        NodeCredential.revoked_at,
        Node.id,
        Node.enabled,
        Node.decommissioned_at,
        Node.agent_version,
        Node.protocol_version,
        Node.capabilities,
        Node.liveness,
        func.statement_timestamp().label("now"),
    ).join(Node, Node.id == NodeCredential.node_id)


async def _load(session: AsyncSession, credential_id: uuid.UUID) -> Row[Any] | None:
    query = _credentials().where(NodeCredential.id == credential_id)
    row: Row[Any] | None = (await session.execute(query)).one_or_none()
    return row


def _admit(row: Row[Any], credential_id: uuid.UUID, serialized: bool) -> AuthenticatedNode:
    if row.decommissioned_at is not None:
        raise Unauthenticated(
            "this node was decommissioned; its identity can never be used again",
            code=ErrorCode.NODE_DECOMMISSIONED,
        )
    if row.revoked_at is not None:
        raise Unauthenticated("this credential was revoked", code=ErrorCode.CREDENTIAL_REVOKED)
    if not row.enabled:
        raise Forbidden("this node is disabled by an operator", code=ErrorCode.NODE_DISABLED)
    return AuthenticatedNode(
        node_id=row.id,
        credential_id=credential_id,
        agent_version=row.agent_version,
        protocol_version=row.protocol_version,
        capabilities=list(row.capabilities),
        liveness=row.liveness,
        received_at=row.now,
        serialized=serialized,
    )


async def authenticate_node(
    session: AsyncSession, authorization: str | None, *, serialize: bool = True
) -> AuthenticatedNode:
    """serialize=False skips the node lock; only for paths that usually emit nothing."""
    presented = secrets.parse(NODE_CREDENTIAL_PREFIX, bearer_value(authorization))
    if presented is None:
        raise Unauthenticated(
            "the value is not a node credential", code=ErrorCode.CREDENTIAL_MALFORMED
        )
    if serialize:
        await _lock_node_of(session, presented.id)
    row = await _load(session, presented.id)
    if not secrets.matches(presented.secret, row.digest if row else None) or row is None:
        raise Unauthenticated("unknown node credential", code=ErrorCode.CREDENTIAL_INVALID)
    return _admit(row, presented.id, serialize)


async def cacheable(session: AsyncSession) -> tuple[list[CachedNode], datetime | None]:
    """Every credential the node cache could hold now, admitted by the same rule as a
    request's (online nodes only, as a committed heartbeat leaves them), and the
    database clock: what warms a new API process's cache (api/node_cache.py: warm)."""
    rows = (
        await session.execute(
            _credentials().where(
                Node.liveness == Liveness.ONLINE.value, NodeCredential.revoked_at.is_(None)
            )
        )
    ).all()
    entries = []
    for row in rows:
        try:
            node = _admit(row, row.credential_id, serialized=False)
        except ApiError:
            continue
        entries.append(
            CachedNode(
                node_id=node.node_id,
                credential_id=node.credential_id,
                digest=row.digest,
                agent_version=node.agent_version,
                protocol_version=node.protocol_version,
                capabilities=tuple(sorted(set(node.capabilities))),
            )
        )
    now = rows[0].now if rows else None
    return entries, now


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
    the database clock (the heartbeat buffer's, which the cache needs). The read is
    guarded like any other: a node changed while it ran is not stored. How many were
    stored; none while LISTEN is down (the cache holds nothing then)."""
    deadline = asyncio.get_running_loop().time() + listening_within_s
    while not cache.listening:
        if asyncio.get_running_loop().time() > deadline:
            return 0
        await asyncio.sleep(0.05)
    generation = cache.generation
    async with sessions() as session, session.begin():
        entries, now = await cacheable(session)
    if now is not None:
        observe(now)
    for entry in entries:
        cache.remember(entry, generation)
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
        liveness="online",
        received_at=received_at,
        serialized=False,
    )


async def serialize(session: AsyncSession, node: AuthenticatedNode) -> AuthenticatedNode:
    """Take the node lock late, then re-check the credential against fresh state.

    The first check ran before the lock; a revocation or decommission may have
    committed while we waited, and it must win.
    """
    if node.serialized:
        return node
    await _lock_node_of(session, node.credential_id)
    row = await _load(session, node.credential_id)
    if row is None:
        raise Unauthenticated("unknown node credential", code=ErrorCode.CREDENTIAL_INVALID)
    fresh = _admit(row, node.credential_id, serialized=True)
    # Keep the original received_at: it is when the request arrived.
    return AuthenticatedNode(**{**fresh.__dict__, "received_at": node.received_at})
