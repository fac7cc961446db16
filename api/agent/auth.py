"""Node bearer-credential authentication, inside the request's transaction."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from api import security
from api.errors import Forbidden, Unauthenticated
from schemas.errors import ErrorCode
from store.models import Node, NodeCredential


@dataclass(frozen=True)
class AuthenticatedNode:
    node_id: uuid.UUID
    credential_id: uuid.UUID
    agent_version: str
    protocol_version: int
    capabilities: list[str]
    # Database clock at authentication: the server-received time of this request.
    received_at: datetime

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


async def authenticate_node(session: AsyncSession, authorization: str | None) -> AuthenticatedNode:
    presented = security.parse(security.NODE_CREDENTIAL_PREFIX, bearer_value(authorization))
    if presented is None:
        raise Unauthenticated(
            "the value is not a node credential", code=ErrorCode.CREDENTIAL_MALFORMED
        )
    row = (
        await session.execute(
            select(
                NodeCredential.digest,
                NodeCredential.revoked_at,
                Node.id,
                Node.enabled,
                Node.decommissioned_at,
                Node.agent_version,
                Node.protocol_version,
                Node.capabilities,
                func.statement_timestamp(),
            )
            .join(Node, Node.id == NodeCredential.node_id)
            .where(NodeCredential.id == presented.id)
        )
    ).one_or_none()
    if not security.matches(presented.secret, row.digest if row else None) or row is None:
        raise Unauthenticated("unknown node credential", code=ErrorCode.CREDENTIAL_INVALID)
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
        credential_id=presented.id,
        agent_version=row.agent_version,
        protocol_version=row.protocol_version,
        capabilities=list(row.capabilities),
        received_at=row[8],
    )
