"""Credential revocation and rotation: separate, audited operations."""

from __future__ import annotations

import uuid

from sqlalchemy.ext.asyncio import AsyncSession

from api import security
from api.admin.nodes import lock_node, require_not_terminal
from schemas.admin import CredentialRevoked, CredentialRotated
from schemas.events import CredentialRevokedEvent, CredentialRotatedEvent, EventType
from store import audit, nodes, outbox
from store.models import NodeCredential


async def revoke_credentials(session: AsyncSession, node_id: uuid.UUID) -> CredentialRevoked:
    node = await lock_node(session, node_id)
    require_not_terminal(node)
    revoked = await nodes.revoke_active_credentials(
        session, node.id, "revoked", await nodes.now(session)
    )
    if revoked:
        audit.record(
            session,
            actor=audit.OPERATOR,
            action="node.credential.revoked",
            target_type="node",
            target_id=node.id,
            details={"credential_ids": [str(c) for c in revoked]},
        )
        outbox.emit(
            session,
            EventType.NODE_CREDENTIAL_REVOKED,
            target_id=node.id,
            node_id=node.id,
            payload=CredentialRevokedEvent(
                node_id=node.id, credential_ids=revoked, reason="revoked"
            ),
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
    issued = security.issue(security.NODE_CREDENTIAL_PREFIX)
    session.add(NodeCredential(id=issued.id, node_id=node.id, digest=issued.digest))
    audit.record(
        session,
        actor=audit.OPERATOR,
        action="node.credential.rotated",
        target_type="node",
        target_id=node.id,
        details={"credential_id": str(issued.id), "revoked": [str(c) for c in revoked]},
    )
    outbox.emit(
        session,
        EventType.NODE_CREDENTIAL_ROTATED,
        target_id=node.id,
        node_id=node.id,
        payload=CredentialRotatedEvent(
            node_id=node.id, credential_id=issued.id, revoked_credential_ids=revoked
        ),
    )
    return CredentialRotated(
        node_id=node.id,
        credential_id=issued.id,
        credential=issued.wire,
        revoked_credential_ids=revoked,
    )
