"""Enrollment tokens: create (secret shown once), list (never the secret), revoke.

A token's state (active, used, revoked, expired) is read by `token_state` and filtered
by the same cases in SQL. A token issued for a node is a recovery token, which
enrollment rebinds that node with (store/enrollment.py). The operator routes call these
directly (api/admin/routes.py).
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, and_, not_, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from schemas.admin import (
    CreateEnrollmentToken,
    EnrollmentTokenCreated,
    EnrollmentTokenInfo,
    TokenState,
)
from schemas.errors import ErrorCode
from schemas.events import OPERATOR_ACTOR, EventType, TokenCreated, TokenRevoked
from schemas.protocol import ENROLLMENT_TOKEN_PREFIX
from store import changes, nodes, secrets
from store.errors import Conflict, Missing
from store.models import EnrollmentToken, Node


def token_state(token: EnrollmentToken, now: datetime) -> TokenState:
    if token.revoked_at is not None:
        return TokenState.REVOKED
    if token.used_at is not None:
        return TokenState.USED
    if token.expires_at is not None and token.expires_at <= now:
        return TokenState.EXPIRED
    return TokenState.ACTIVE


def token_info(token: EnrollmentToken, now: datetime) -> EnrollmentTokenInfo:
    return EnrollmentTokenInfo(
        id=token.id,
        state=token_state(token, now),
        created_at=token.created_at,
        expires_at=token.expires_at,
        labels=dict(token.labels),
        display_name=token.display_name,
        note=token.note,
        node_id=token.node_id,
        used_at=token.used_at,
        used_by_node_id=token.used_by_node_id,
        revoked_at=token.revoked_at,
    )


async def create(session: AsyncSession, body: CreateEnrollmentToken) -> EnrollmentTokenCreated:
    now = await nodes.now(session)
    if body.node_id is not None:
        node = await session.get(Node, body.node_id)
        if node is None:
            raise Missing(f"node {body.node_id} does not exist", code=ErrorCode.NOT_FOUND)
        if node.decommissioned_at is not None:
            raise Conflict("the node was decommissioned", code=ErrorCode.NODE_TERMINAL)
    issued = secrets.issue(ENROLLMENT_TOKEN_PREFIX)
    token = EnrollmentToken(
        id=issued.id,
        digest=issued.digest,
        created_at=now,
        expires_at=now + timedelta(seconds=body.expires_in_s) if body.expires_in_s else None,
        labels=dict(body.labels),
        display_name=body.display_name,
        note=body.note,
        node_id=body.node_id,
    )
    session.add(token)
    changes.record(
        session,
        EventType.TOKEN_CREATED,
        TokenCreated(
            token_id=token.id,
            expires_at=token.expires_at,
            labels=token.labels,
            node_id=body.node_id,
        ),
        actor=OPERATOR_ACTOR,
    )
    return EnrollmentTokenCreated(token=token_info(token, now), secret=issued.wire)


def _state_filter(state: TokenState, now: datetime) -> ColumnElement[bool]:
    t = EnrollmentToken
    unexpired = or_(t.expires_at.is_(None), t.expires_at > now)
    return {
        TokenState.REVOKED: t.revoked_at.is_not(None),
        TokenState.USED: and_(t.revoked_at.is_(None), t.used_at.is_not(None)),
        TokenState.EXPIRED: and_(t.revoked_at.is_(None), t.used_at.is_(None), not_(unexpired)),
        TokenState.ACTIVE: and_(t.revoked_at.is_(None), t.used_at.is_(None), unexpired),
    }[state]


async def listed(
    session: AsyncSession, state: TokenState | None, limit: int
) -> list[EnrollmentTokenInfo]:
    now = await nodes.now(session)
    query = select(EnrollmentToken).order_by(EnrollmentToken.created_at.desc()).limit(limit)
    if state is not None:
        query = query.where(_state_filter(state, now))
    return [token_info(token, now) for token in (await session.execute(query)).scalars()]


async def revoke(
    session: AsyncSession, token_id: uuid.UUID, *, reason: str = "operator"
) -> EnrollmentTokenInfo:
    token = await session.get(EnrollmentToken, token_id, with_for_update=True)
    if token is None:
        raise Missing(f"enrollment token {token_id} does not exist", code=ErrorCode.NOT_FOUND)
    now = await nodes.now(session)
    if token.used_at is not None:
        raise Conflict("the token was already used", code=ErrorCode.STATE_CONFLICT)
    if token.revoked_at is None:
        token.revoked_at = now
        changes.record(
            session,
            EventType.TOKEN_REVOKED,
            TokenRevoked(token_id=token.id, reason=reason),
            actor=OPERATOR_ACTOR,
        )
    return token_info(token, now)
