"""Enrollment: a one-time token becomes a node identity and its first credential.

The token's row lock makes it single-use; an ordinary token creates a new node with its
streams, a recovery token (issued for a node, store/tokens.py) rebinds that node and
revokes its old credentials. The node's credential is issued, and its later requests
admitted, by store/node_credentials.py; only the credential's digest is kept.
The API route (api/agent/routes.py) only calls `enroll`.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from schemas.agent import EnrollRequest, EnrollResponse
from schemas.errors import ErrorCode
from schemas.events import EventType, NodeEnrolled, node_actor
from schemas.protocol import ENROLLMENT_TOKEN_PREFIX, StreamName
from store import changes, node_credentials, nodes, secrets
from store.errors import Conflict, Unauthenticated
from store.models import EnrollmentToken, Node, NodeStream
from store.protocol_versions import require_supported

STREAMS = tuple(StreamName)


async def _claim_token(session: AsyncSession, wire: str) -> tuple[EnrollmentToken, datetime]:
    presented = secrets.parse(ENROLLMENT_TOKEN_PREFIX, wire)
    if presented is None:
        raise Unauthenticated(
            "the value is not an enrollment token", code=ErrorCode.ENROLLMENT_TOKEN_INVALID
        )
    # The row lock is the single-use guarantee: concurrent enrolls with one token
    # queue here, and every one after the first sees it used.
    token = await session.get(EnrollmentToken, presented.id, with_for_update=True)
    if token is None or not secrets.matches(presented.secret, token.digest):
        raise Unauthenticated("unknown enrollment token", code=ErrorCode.ENROLLMENT_TOKEN_INVALID)
    now = await nodes.now(session)
    if token.revoked_at is not None:
        raise Unauthenticated("enrollment token revoked", code=ErrorCode.ENROLLMENT_TOKEN_REVOKED)
    if token.used_at is not None:
        raise Unauthenticated("enrollment token already used", code=ErrorCode.ENROLLMENT_TOKEN_USED)
    if token.expires_at is not None and token.expires_at <= now:
        raise Unauthenticated("enrollment token expired", code=ErrorCode.ENROLLMENT_TOKEN_EXPIRED)
    return token, now


async def _rebind(
    session: AsyncSession, token: EnrollmentToken, request: EnrollRequest, now: datetime
) -> Node:
    assert token.node_id is not None
    if request.node_id is not None and request.node_id != token.node_id:
        raise Conflict(
            "this recovery token belongs to a different node identity",
            code=ErrorCode.IDENTITY_CONFLICT,
        )
    node = await nodes.lock(session, token.node_id)
    assert node is not None  # a recovery token's node is a foreign key
    if nodes.is_terminal(node):
        raise Conflict("the node was decommissioned", code=ErrorCode.NODE_TERMINAL)
    await node_credentials.revoke_all(
        session, node.id, "re-enrolled", now, actor=node_actor(node.id)
    )
    node.hostname = request.hostname
    node.agent_version = request.agent_version
    node.protocol_version = request.protocol_version
    node.capabilities = list(request.capabilities)
    node.updated_at = now
    return node


async def _create(session: AsyncSession, token: EnrollmentToken, request: EnrollRequest) -> Node:
    if request.node_id is not None:
        # An ordinary token makes a new identity; adopting an existing one needs a
        # recovery token issued for it.
        raise Conflict(
            "node_id given, but this token is not a recovery token for that node",
            code=ErrorCode.IDENTITY_CONFLICT,
        )
    node = Node(
        id=uuid.uuid4(),
        hostname=request.hostname,
        display_name=token.display_name,
        labels=dict(token.labels),
        protocol_version=request.protocol_version,
        agent_version=request.agent_version,
        capabilities=list(request.capabilities),
    )
    session.add(node)
    await session.flush()
    session.add_all(NodeStream(node_id=node.id, stream=stream) for stream in STREAMS)
    return node


async def enroll(
    session: AsyncSession, request: EnrollRequest, *, heartbeat_interval_s: float
) -> EnrollResponse:
    # Before the token claim, so an incompatible agent does not burn its token.
    require_supported(request.protocol_version)
    token, now = await _claim_token(session, request.enrollment_token)
    rebound = token.node_id is not None
    node = await (
        _rebind(session, token, request, now) if rebound else _create(session, token, request)
    )
    token.used_at = now
    token.used_by_node_id = node.id
    issued = node_credentials.issue(session, node.id)
    changes.record(
        session,
        EventType.NODE_ENROLLED,
        NodeEnrolled(
            node_id=node.id,
            hostname=node.hostname,
            agent_version=node.agent_version,
            protocol_version=node.protocol_version,
            capabilities=list(node.capabilities),
            labels=dict(node.labels),
            token_id=token.id,
            credential_id=issued.id,
            rebound=rebound,
        ),
        actor=node_actor(node.id),
    )
    return EnrollResponse(
        node_id=node.id,
        credential_id=issued.id,
        credential=issued.wire,
        heartbeat_interval_s=heartbeat_interval_s,
        server_time=now,
        protocol_version=request.protocol_version,
    )
