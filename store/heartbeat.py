"""The heartbeat's rules: what a heartbeat writes, decided on the database.

* `record_heartbeat`, the transactional one: one UPDATE of `last_heartbeat_at`, and the
  node lock plus an event only when something changed (the node comes back online, or
  the agent's facts changed);
* `agent_changed`: whether a heartbeat brings new agent facts; the API's routine check
  (api/agent/heartbeat.py: routine) asks it about a cached node too;
* `record_returns`: the transactional one for many nodes at once, when a fleet comes
  back (after an outage of the API or the network, or a restart) and every node's
  heartbeat would otherwise be a transaction of its own;
* `write_routine`: the group commit of routine heartbeats, many nodes in one statement,
  each at the database clock minus its age (api/heartbeat_buffer.py holds them until
  then).

The API decides which path a heartbeat takes and caches the node afterwards
(api/agent/heartbeat.py); the node comes in admitted (store/node_credentials.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from sqlalchemy import DateTime, bindparam, text, update
from sqlalchemy.dialects.postgresql import ARRAY, DOUBLE_PRECISION, UUID
from sqlalchemy.ext.asyncio import AsyncSession

from schemas.admin import Liveness
from schemas.agent import HeartbeatRequest, HeartbeatResponse
from schemas.events import EventType, NodeAgentChanged, node_actor
from store import changes
from store.errors import StoreError
from store.liveness import record_transition, transition_event
from store.models import Node
from store.node_credentials import AuthenticatedNode, admit_locked, serialize
from store.protocol_versions import require_supported
from store.secrets import PresentedSecret

ONLINE = Liveness.ONLINE.value


def agent_changed(
    agent_version: str,
    protocol_version: int,
    capabilities: Sequence[str],
    request: HeartbeatRequest,
) -> bool:
    return (
        request.agent_version != agent_version
        or request.protocol_version != protocol_version
        or sorted(set(request.capabilities)) != sorted(set(capabilities))
    )


def _differs(node: AuthenticatedNode, request: HeartbeatRequest) -> bool:
    return agent_changed(node.agent_version, node.protocol_version, node.capabilities, request)


def answer(node_id: uuid.UUID, received_at: datetime, interval_s: float) -> HeartbeatResponse:
    return HeartbeatResponse(
        node_id=node_id,
        received_at=received_at,
        heartbeat_interval_s=interval_s,
        server_time=received_at,
    )


async def record_heartbeat(
    session: AsyncSession,
    node: AuthenticatedNode,
    request: HeartbeatRequest,
    *,
    heartbeat_interval_s: float,
) -> HeartbeatResponse:
    node.require_owns(request.node_id)
    require_supported(request.protocol_version)
    capabilities = sorted(set(request.capabilities))
    if _differs(node, request) or node.liveness != ONLINE:
        # An event is coming: take the node lock and decide again on fresh state.
        node = await serialize(session, node)
    changed = _differs(node, request)
    values: dict[str, object] = {"last_heartbeat_at": node.received_at}
    if changed:
        values |= {
            "agent_version": request.agent_version,
            "protocol_version": request.protocol_version,
            "capabilities": capabilities,
            "updated_at": node.received_at,
        }
    await session.execute(update(Node).where(Node.id == node.node_id).values(**values))
    if node.liveness != ONLINE:
        # Back (or here for the first time): recorded now, not at the next sweep.
        await record_transition(
            session,
            node_id=node.node_id,
            previous=node.liveness,
            current=ONLINE,
            last_heartbeat_at=node.received_at,
            decided_by="heartbeat",
            at=node.received_at,
        )
    if changed:
        change = NodeAgentChanged(
            node_id=node.node_id,
            agent_version=request.agent_version,
            protocol_version=request.protocol_version,
            capabilities=capabilities,
            previous_agent_version=node.agent_version,
            previous_capabilities=list(node.capabilities),
        )
        changes.record(
            session, EventType.NODE_AGENT_CHANGED, change, actor=node_actor(node.node_id)
        )
    return answer(node.node_id, node.received_at, heartbeat_interval_s)


_ROUTINE: Final = text(
    """
    WITH beats AS (
        SELECT v.id, statement_timestamp() - make_interval(secs => v.age) AS at
        FROM unnest(:ids, :ages) AS v(id, age)
    ), locked AS (
        -- In id order, as every multi-node writer should: two API processes flushing
        -- overlapping nodes (or a flush and a sweep) then never deadlock.
        SELECT n.id FROM nodes AS n JOIN beats ON beats.id = n.id ORDER BY n.id FOR UPDATE OF n
    ), written AS (
        UPDATE nodes AS n SET last_heartbeat_at = beats.at
        FROM beats JOIN locked ON locked.id = beats.id
        WHERE n.id = beats.id AND (n.last_heartbeat_at IS NULL OR n.last_heartbeat_at < beats.at)
        RETURNING 1
    )
    SELECT statement_timestamp() AS now, (SELECT count(*) FROM written) AS written
    """
).bindparams(
    bindparam("ids", type_=ARRAY(UUID(as_uuid=True))),
    bindparam("ages", type_=ARRAY(DOUBLE_PRECISION())),
)


@dataclass(frozen=True)
class RoutineWritten:
    # The database clock when the statement ran.
    now: datetime
    # Nodes whose last_heartbeat_at moved (never backwards: a later heartbeat that
    # took the transactional path meanwhile wins).
    written: int


async def write_routine(
    session: AsyncSession, ids: Sequence[uuid.UUID], ages_s: Sequence[float]
) -> RoutineWritten:
    """Routine heartbeats of many nodes in one statement: each node's last_heartbeat_at
    becomes the database clock minus its age (seconds since it arrived), so liveness
    stays decided from server-received time on the database clock."""
    row = (await session.execute(_ROUTINE, {"ids": list(ids), "ages": list(ages_s)})).one()
    return RoutineWritten(now=row.now, written=int(row.written))


_RETURNED: Final = text(
    """
    UPDATE nodes AS n SET
        last_heartbeat_at = :at,
        liveness = 'online',
        liveness_changed_at = CASE WHEN n.liveness = 'online'
            THEN n.liveness_changed_at ELSE :at END
    WHERE n.id = ANY(:ids)
    """
).bindparams(
    bindparam("ids", type_=ARRAY(UUID(as_uuid=True))),
    bindparam("at", type_=DateTime(timezone=True)),
)


@dataclass(frozen=True)
class Returning:
    """A heartbeat of a node the API does not hold as online: its credential as
    presented, and the request."""

    presented: PresentedSecret
    request: HeartbeatRequest


async def record_returns(
    session: AsyncSession, returning: Sequence[Returning]
) -> list[AuthenticatedNode | None]:
    """`record_heartbeat` for many nodes in four statements: their node locks (those free
    now), their credentials, one UPDATE, and the liveness events. For each heartbeat,
    the node as it is now recorded (online, heard at the database clock), or None when
    it must be decided alone by `record_heartbeat`: a credential it would refuse, a
    heartbeat naming another node or an unsupported protocol, new agent facts (their
    event), or a second heartbeat of a node already in this batch. Those get the
    single path's typed answer there; nothing of theirs is written here. So is one whose
    node lock another transaction holds: the batch never waits for one."""
    admitted = await admit_locked(session, [r.presented for r in returning])
    decided: list[AuthenticatedNode | None] = []
    batched: set[uuid.UUID] = set()
    for r, node in zip(returning, admitted, strict=True):
        if node is None or node.node_id in batched or _differs(node, r.request):
            decided.append(None)
            continue
        try:
            node.require_owns(r.request.node_id)
            require_supported(r.request.protocol_version)
        except StoreError:
            decided.append(None)
            continue
        batched.add(node.node_id)
        decided.append(node)
    written = [node for node in decided if node is not None]
    if not written:
        return decided
    # Admission read the database clock once: every node of the batch is heard at it.
    at = written[0].received_at
    await session.execute(_RETURNED, {"ids": [node.node_id for node in written], "at": at})
    for node in written:
        if node.liveness != ONLINE:
            transition_event(
                session,
                node_id=node.node_id,
                previous=node.liveness,
                current=ONLINE,
                last_heartbeat_at=at,
                decided_by="heartbeat",
            )
    return [
        None if node is None else AuthenticatedNode(**{**node.__dict__, "liveness": ONLINE})
        for node in decided
    ]
