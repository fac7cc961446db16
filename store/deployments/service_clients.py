"""Service clients, the gateway's callers: create, list, get, rotate, revoke, and the
check the gateway makes on every call (api/gateway/auth.py).

The secret is issued here (store/secrets.py), as enrollment tokens and node credentials
are (store/tokens.py, store/node_credentials.py): create and rotate hand it back to be
shown once, and only its digest is kept. The id in the wire format is the client's
primary key; a rotation keeps the id and replaces the digest in the same transaction, so
the old secret stops working the moment the rotation commits.
"""

from __future__ import annotations

import hashlib
import hmac
import uuid
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from schemas.errors import ErrorCode
from schemas.events import EventType, ServiceClientEvent
from schemas.protocol import SERVICE_CLIENT_PREFIX
from schemas.service_clients import ServiceClientCreate, ServiceClientState
from store import changes, nodes, secrets, session_notes
from store.deployments.service_client_tables import ServiceClient
from store.errors import Conflict, Missing, Unauthenticated

# Compared against when no row exists, so an unknown id costs what a wrong secret does.
_DUMMY_DIGEST = hashlib.sha256(b"modelforge-dummy-service-client").digest()


@dataclass(frozen=True)
class IssuedClient:
    """A client and the secret it was just issued, in its wire format: for the one
    answer that shows it; only its digest is stored."""

    client: ServiceClient
    secret: str


def state_of(client: ServiceClient) -> ServiceClientState:
    return ServiceClientState.REVOKED if client.revoked_at else ServiceClientState.ACTIVE


def _event(client: ServiceClient) -> ServiceClientEvent:
    return ServiceClientEvent(client_id=client.id, name=client.name)


async def create(session: AsyncSession, body: ServiceClientCreate, *, actor: str) -> IssuedClient:
    issued = secrets.issue(SERVICE_CLIENT_PREFIX)
    client = ServiceClient(
        id=issued.id,
        name=body.name,
        digest=issued.digest,
        models=list(body.models),
        roles=list(body.roles),
        max_concurrent=body.max_concurrent,
        rate_per_minute=body.rate_per_minute,
        max_tokens_per_day=body.max_tokens_per_day,
        created_at=await nodes.now(session),
        rotated_at=None,
        revoked_at=None,
    )
    session.add(client)
    changes.record(session, EventType.SERVICE_CLIENT_CREATED, _event(client), actor=actor)
    return IssuedClient(client, issued.wire)


async def clients(
    session: AsyncSession, state: ServiceClientState | None = None, limit: int = 100
) -> list[ServiceClient]:
    """Newest first."""
    query = (
        select(ServiceClient)
        .order_by(ServiceClient.created_at.desc(), ServiceClient.id)
        .limit(limit)
    )
    if state is ServiceClientState.ACTIVE:
        query = query.where(ServiceClient.revoked_at.is_(None))
    elif state is ServiceClientState.REVOKED:
        query = query.where(ServiceClient.revoked_at.is_not(None))
    return list((await session.execute(query)).scalars().all())


async def get(
    session: AsyncSession, client_id: uuid.UUID, *, for_update: bool = False
) -> ServiceClient:
    client = await session.get(ServiceClient, client_id, with_for_update=for_update)
    if client is None:
        raise Missing(f"no service client {client_id}", code=ErrorCode.NOT_FOUND)
    return client


async def rotate(session: AsyncSession, client_id: uuid.UUID, *, actor: str) -> IssuedClient:
    """A new secret under the client's own id; the old one stops working when this
    commits."""
    client = await get(session, client_id, for_update=True)
    if client.revoked_at is not None:
        raise Conflict("the service client was revoked", code=ErrorCode.STATE_CONFLICT)
    issued = secrets.issue(SERVICE_CLIENT_PREFIX, client.id)
    client.digest = issued.digest
    session_notes.note(session, session_notes.SERVICE_CLIENT, client.id)
    client.rotated_at = await nodes.now(session)
    changes.record(session, EventType.SERVICE_CLIENT_ROTATED, _event(client), actor=actor)
    return IssuedClient(client, issued.wire)


async def revoke(session: AsyncSession, client_id: uuid.UUID, *, actor: str) -> ServiceClient:
    """Revoked for good; revoking again is refused (409), the first revocation stands."""
    client = await get(session, client_id, for_update=True)
    if client.revoked_at is not None:
        raise Conflict("the service client was already revoked", code=ErrorCode.STATE_CONFLICT)
    client.revoked_at = await nodes.now(session)
    session_notes.note(session, session_notes.SERVICE_CLIENT, client.id)
    changes.record(session, EventType.SERVICE_CLIENT_REVOKED, _event(client), actor=actor)
    return client


def changed(session: AsyncSession) -> set[uuid.UUID]:
    """The clients this transaction rotated or revoked (the note is taken)."""
    return session_notes.take(session, session_notes.SERVICE_CLIENT)


async def authenticate(
    session: AsyncSession, client_id: uuid.UUID, presented_digest: bytes
) -> ServiceClient:
    """The live client whose id and secret (its digest) were presented. Found by primary
    key, then compared in constant time (against a dummy when there is no row), so
    neither the index nor the comparison tells a wrong secret from an unknown id. A
    revoked client is told apart only to a caller who holds its real secret. Refused as
    Unauthenticated (401): credential_invalid or credential_revoked."""
    client = await session.get(ServiceClient, client_id)
    stored = client.digest if client is not None else _DUMMY_DIGEST
    if not hmac.compare_digest(presented_digest, stored) or client is None:
        raise Unauthenticated(
            "unknown service client credential", code=ErrorCode.CREDENTIAL_INVALID
        )
    if client.revoked_at is not None:
        raise Unauthenticated("this service client was revoked", code=ErrorCode.CREDENTIAL_REVOKED)
    return client
