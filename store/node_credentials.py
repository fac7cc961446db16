"""A node's bearer credentials: admitting one inside the request's transaction, the
credentials the API's node cache may hold, issuing one (`issue`: enrollment, rotation),
and ending or replacing them (an operator's revoke and rotate; enrollment's rebind
revokes through `revoke_all`).

Admission reads the credential, its node and the database clock in one statement: a
decommissioned node or a revoked credential is Unauthenticated (401), a disabled node
Forbidden (403). The node lock (store/locks.py) is taken before the read on paths that
emit events, or late (`serialize`) on the heartbeat's, which usually emits nothing; the
late one re-reads, so a revocation or decommission that committed meanwhile wins.

The API parses the Authorization header and keeps the node cache (api/agent/auth.py);
the rules that take an admitted node are store/heartbeat.py and store/ingest.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Row, Select, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from schemas.admin import CredentialRevoked, CredentialRotated, Liveness
from schemas.errors import ErrorCode
from schemas.events import (
    OPERATOR_ACTOR,
    CredentialRevokedEvent,
    CredentialRotatedEvent,
    EventType,
)
from schemas.protocol import NODE_CREDENTIAL_PREFIX
from store import changes, nodes, secrets
from store.errors import Forbidden, NotOwned, StoreError, Unauthenticated
from store.locks import node_xact_lock, try_lock_nodes_of_credentials
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
            raise NotOwned(
                "the credential belongs to a different node", code=ErrorCode.NODE_MISMATCH
            )


@dataclass(frozen=True)
class LiveCredential:
    """A credential admission takes now, with its digest (what the node cache keeps)."""

    node: AuthenticatedNode
    digest: bytes


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


def parse_presented(credential: str) -> secrets.PresentedSecret:
    """The parts of a presented node credential, or the 401 for a value that cannot be
    one: decided without the database."""
    presented = secrets.parse(NODE_CREDENTIAL_PREFIX, credential)
    if presented is None:
        raise Unauthenticated(
            "the value is not a node credential", code=ErrorCode.CREDENTIAL_MALFORMED
        )
    return presented


async def authenticate(
    session: AsyncSession, credential: str, *, serialize: bool = True
) -> AuthenticatedNode:
    """The node whose credential (the bearer value) was presented. serialize=False skips
    the node lock; only for paths that usually emit nothing."""
    presented = parse_presented(credential)
    if serialize:
        await _lock_node_of(session, presented.id)
    row = await _load(session, presented.id)
    if not secrets.matches(presented.secret, row.digest if row else None) or row is None:
        raise Unauthenticated("unknown node credential", code=ErrorCode.CREDENTIAL_INVALID)
    return _admit(row, presented.id, serialize)


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


async def admit_locked(
    session: AsyncSession, presented: Sequence[secrets.PresentedSecret]
) -> list[AuthenticatedNode | None]:
    """Many credentials admitted at once under their nodes' locks (a batch of returning
    heartbeats: store/heartbeat.py: record_returns), in order. One that would be refused,
    or whose node lock another transaction holds now, is None: its request is decided
    alone, which waits for the lock and gives the typed answer. Each presented secret is
    checked on its own, so a wrong secret is refused even beside the right one for the
    same credential id."""
    ids = [p.id for p in presented]
    locked = await try_lock_nodes_of_credentials(session, ids)
    rows = {
        row.credential_id: row
        for row in (await session.execute(_credentials().where(NodeCredential.id.in_(ids))))
    }
    admitted: list[AuthenticatedNode | None] = []
    for p in presented:
        row = rows.get(p.id)
        if row is None or p.id not in locked or not secrets.matches(p.secret, row.digest):
            admitted.append(None)
            continue
        try:
            admitted.append(_admit(row, p.id, serialized=True))
        except StoreError:
            admitted.append(None)
    return admitted


async def live_online(session: AsyncSession) -> tuple[list[LiveCredential], datetime | None]:
    """Every live credential of an online node, admitted by the same rule as a request's,
    and the database clock (None when there is none): what a new API process warms its
    node cache from (api/agent/auth.py: warm)."""
    rows = (
        await session.execute(
            _credentials().where(
                Node.liveness == Liveness.ONLINE.value, NodeCredential.revoked_at.is_(None)
            )
        )
    ).all()
    live = []
    for row in rows:
        try:
            node = _admit(row, row.credential_id, serialized=False)
        except StoreError:
            continue
        live.append(LiveCredential(node=node, digest=row.digest))
    now = rows[0].now if rows else None
    return live, now


def issue(session: AsyncSession, node_id: uuid.UUID) -> secrets.IssuedSecret:
    """A new credential for the node (enrollment's first, or a rotation's): only its
    digest is stored; the wire value is for the one answer that shows it."""
    issued = secrets.issue(NODE_CREDENTIAL_PREFIX)
    session.add(NodeCredential(id=issued.id, node_id=node_id, digest=issued.digest))
    return issued


async def revoke_all(
    session: AsyncSession, node_id: uuid.UUID, reason: str, at: datetime, *, actor: str
) -> list[uuid.UUID]:
    """Revoke every active credential of the node, with the revocation's event when
    there was one to revoke; the ids revoked."""
    revoked = await nodes.revoke_active_credentials(session, node_id, reason, at)
    if revoked:
        changes.record(
            session,
            EventType.NODE_CREDENTIAL_REVOKED,
            CredentialRevokedEvent(node_id=node_id, credential_ids=revoked, reason=reason),
            actor=actor,
        )
    return revoked


async def revoke(session: AsyncSession, node_id: uuid.UUID) -> CredentialRevoked:
    """An operator ends the node's credentials; the node re-enrolls with a recovery token."""
    node = await nodes.lock_existing(session, node_id)
    nodes.require_not_terminal(node)
    revoked = await revoke_all(
        session, node.id, "revoked", await nodes.now(session), actor=OPERATOR_ACTOR
    )
    return CredentialRevoked(node_id=node.id, revoked_credential_ids=revoked)


async def rotate(session: AsyncSession, node_id: uuid.UUID) -> CredentialRotated:
    """An operator replaces the node's credential: the new one is shown once, the old
    ones stop working when this commits."""
    # The node row lock serialises rotations; the partial unique index on active
    # credentials would reject a second active one even if it did not.
    node = await nodes.lock_existing(session, node_id)
    nodes.require_not_terminal(node)
    revoked = await nodes.revoke_active_credentials(
        session, node.id, "rotated", await nodes.now(session)
    )
    issued = issue(session, node.id)
    changes.record(
        session,
        EventType.NODE_CREDENTIAL_ROTATED,
        CredentialRotatedEvent(
            node_id=node.id, credential_id=issued.id, revoked_credential_ids=revoked
        ),
        actor=OPERATOR_ACTOR,
    )
    return CredentialRotated(
        node_id=node.id,
        credential_id=issued.id,
        credential=issued.wire,
        revoked_credential_ids=revoked,
    )
