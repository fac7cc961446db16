"""Permanent decommission: a terminal state that refuses the identity everywhere, forever."""

from __future__ import annotations

import uuid

from sqlalchemy import ColumnElement, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from api.admin.nodes import lock_node, require_not_terminal
from api.errors import Conflict, NotFound
from schemas.admin import DecommissionPreview, DecommissionRequest, DecommissionResult, Liveness
from schemas.errors import ErrorCode
from schemas.events import OPERATOR_ACTOR, EventType, NodeDecommissioned
from store import changes, nodes
from store.liveness import LivenessThresholds, liveness_expression
from store.models import EnrollmentToken, Gpu, Node, NodeCredential


def _open_recovery_tokens(node_id: uuid.UUID) -> tuple[ColumnElement[bool], ...]:
    return (
        EnrollmentToken.node_id == node_id,
        EnrollmentToken.used_at.is_(None),
        EnrollmentToken.revoked_at.is_(None),
    )


async def preview(
    session: AsyncSession, thresholds: LivenessThresholds, node_id: uuid.UUID
) -> DecommissionPreview:
    row = (
        await session.execute(
            select(Node, liveness_expression(thresholds)).where(Node.id == node_id)
        )
    ).one_or_none()
    if row is None:
        raise NotFound(f"node {node_id} does not exist")
    node, liveness = row
    credentials = (
        await session.execute(
            select(NodeCredential.id).where(
                NodeCredential.node_id == node_id, NodeCredential.revoked_at.is_(None)
            )
        )
    ).scalars()
    tokens = (
        await session.execute(select(EnrollmentToken.id).where(*_open_recovery_tokens(node_id)))
    ).scalars()
    gpus = (
        await session.execute(select(func.count()).select_from(Gpu).where(Gpu.node_id == node_id))
    ).scalar_one()
    return DecommissionPreview(
        node_id=node_id,
        already_decommissioned=node.decommissioned_at is not None,
        credentials_to_revoke=list(credentials),
        enrollment_tokens_to_revoke=list(tokens),
        gpus=gpus,
        liveness=Liveness(liveness),
    )


async def execute(
    session: AsyncSession, node_id: uuid.UUID, request: DecommissionRequest
) -> DecommissionResult:
    if request.confirm_node_id != node_id:
        raise Conflict(
            "confirm_node_id does not match the node being decommissioned",
            code=ErrorCode.IDENTITY_CONFLICT,
        )
    node = await lock_node(session, node_id)
    require_not_terminal(node)
    now = await nodes.now(session)
    revoked = await nodes.revoke_active_credentials(session, node.id, "decommissioned", now)
    tokens = list(
        (
            await session.execute(
                update(EnrollmentToken)
                .where(*_open_recovery_tokens(node.id))
                .values(revoked_at=now)
                .returning(EnrollmentToken.id)
            )
        ).scalars()
    )
    node.decommissioned_at = now
    nodes.standing_changed(session, node.id)
    node.decommission_reason = request.reason
    node.updated_at = now
    changes.record(
        session,
        EventType.NODE_DECOMMISSIONED,
        NodeDecommissioned(
            node_id=node.id,
            reason=request.reason,
            revoked_credential_ids=revoked,
            revoked_enrollment_token_ids=list(tokens),
        ),
        actor=OPERATOR_ACTOR,
    )
    return DecommissionResult(
        node_id=node.id,
        decommissioned_at=now,
        revoked_credential_ids=revoked,
        revoked_enrollment_token_ids=tokens,
    )
