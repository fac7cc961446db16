"""Permanent decommission: a terminal state that refuses the identity everywhere, forever.

`preview` says what a decommission would end; `execute`, under the node's lock, revokes
its credentials and its open recovery tokens, marks it decommissioned (every API
process drops it from its node cache: store/nodes.py standing_changed) and records the
one event. Admission refuses the node from then on (store/node_credentials.py). The
operator routes call these directly (api/admin/routes.py).
"""

from __future__ import annotations

import uuid

from sqlalchemy import ColumnElement, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from schemas.admin import DecommissionPreview, DecommissionRequest, DecommissionResult, Liveness
from schemas.errors import ErrorCode
from schemas.events import OPERATOR_ACTOR, EventType, NodeDecommissioned
from store import changes, nodes
from store.errors import Conflict, Missing
from store.liveness import LivenessThresholds
from store.models import EnrollmentToken, Gpu, NodeCredential


def _open_recovery_tokens(node_id: uuid.UUID) -> tuple[ColumnElement[bool], ...]:
    return (
        EnrollmentToken.node_id == node_id,
        EnrollmentToken.used_at.is_(None),
        EnrollmentToken.revoked_at.is_(None),
    )


async def preview(
    session: AsyncSession, thresholds: LivenessThresholds, node_id: uuid.UUID
) -> DecommissionPreview:
    row = await nodes.with_liveness(session, thresholds, node_id)
    if row is None:
        raise Missing(f"node {node_id} does not exist", code=ErrorCode.NOT_FOUND)
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
    node = await nodes.lock_existing(session, node_id)
    nodes.require_not_terminal(node)
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
