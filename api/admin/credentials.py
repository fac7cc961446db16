"""Credential revocation and rotation: separate, audited operations."""

from __future__ import annotations

import uuid

from sqlalchemy.ext.asyncio import AsyncSession

from api.admin.nodes import lock_node, require_not_terminal
from schemas.admin import CredentialRevoked, CredentialRotated
from schemas.events import (
    OPERATOR_ACTOR,
    CredentialRevokedEvent,
    CredentialRotatedEvent,
    EventType,
)
from schemas.protocol import NODE_CREDENTIAL_PREFIX
from store import changes, nodes, secrets
from store.models import NodeCredential


async def revoke_credentials(session: AsyncSession, node_id: uuid.UUID) -> CredentialRevoked:
    node = await lock_node(session, node_id)
    require_not_terminal(node)
    revoked = await nodes.revoke_active_credentials(
        session, node.id, "revoked", await nodes.now(session)
    )
    if revoked:
        changes.record(
            session,
            EventType.NODE_CREDENTIAL_REVOKED,
            CredentialRevokedEvent(node_id=node.id, credential_ids=revoked, reason="revoked"),
            actor=OPERATOR_ACTOR,
        )
    return CredentialRevoked(node_id=node.id, revoked_credential_ids=revoked)


async def rotate_credential(session: AsyncSession, node_id: uuid.UUID) -> CredentialRotated:
    # The node row lock serialises rotations; the partial unique index on active
    # credentials would reject a second active one even if it did not.
    node = await lock_node(session, node_id)
    require_not_terminal(node)
    revoked = await nodes.revoke_active_credentials(
        session, node.id, "rotated", await nodes.now(session)
    )
    issued = secrets.issue(NODE_CREDENTIAL_PREFIX)
    session.add(NodeCredential(id=issued.id, node_id=node.id, digest=issued.digest))
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
