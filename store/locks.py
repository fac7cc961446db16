"""Per-node advisory locks.

Every transaction that may emit events for a node takes this lock before it reads
the node's state, so two transactions of one node never interleave their outbox
inserts: the outbox position order (which the relay publishes in) is then each
node's commit order.

Lock order. A transaction that locks more than one of a node's rows takes them in this
order, and never the other way round:

1. the node's event lock (node_xact_lock), then the node's row (store/nodes.py: lock);
2. the node's jobs (FOR UPDATE, in id order when several);
3. the node's deployments (FOR UPDATE, in id order when several).

The agent routes (claim, report, settle: the job, then its deployment), a decommission
(store/decommission.py: the node, its open jobs, its live deployments), a drain or an
unload (store/deployments/rules.py: drain) and the reconciler
(store/deployments/reconcile.py: reconcile_one) all follow it. A drain used to lock its
deployment before anything else, and then deadlocked with a decommission of the node
(tests/test_decommission_drain_race.py).
A transaction that does not take the node's lock may still lock rows of level 2 or 3
only if it never waits for another lock while holding them: leases.expire_due takes jobs
with SKIP LOCKED, then only *tries* each job's node lock (skipping the job when busy).

Services (issue 32). A service's row comes before any node's lock, never after:

0. the service's row (services: FOR UPDATE; the reconciler's step takes it with SKIP
   LOCKED, store/services/reconcile.py: reconcile_one), then levels 1-3 of its
   replicas' nodes as above.

The API's service rules (store/services/rules.py: scale, rollout, undo, delete) take
the service's row only (create: the name's own advisory lock), no node's lock. Nothing
that holds a node's lock (the agent routes, a decommission, the deployment reconciler,
the liveness sweep) ever waits for a service's row, so service → node cannot close a
cycle with them.

Two reconciler steps (two services, each holding its own row) may both need node locks.
A step follows its live replicas in node-id order (each follow may lock its replica's
node), and a new replica's node is only *tried* (store/services/replicas.py:
try_lock_node, the event lock tried and the row FOR UPDATE NOWAIT in a savepoint): held
elsewhere, that placement waits for the next sweep instead of waiting on a lock while
the step holds others (tests/test_service_node_loss.py:
test_a_placement_never_waits_on_a_node_lock_another_holds). What is left: a step's
drains (a delete, a scale-down, a rollout's replaced replicas) lock their nodes in the
drain order, not by node id, after its follows; two steps draining replicas on the same
two nodes in opposite orders can still deadlock. PostgreSQL detects it (deadlock_timeout)
and aborts one step, which the sweep logs and retries on its next pass
(workers/service_reconcile.py): a delay, never a lost or doubled change.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Final

from sqlalchemy import ColumnElement, Text, bindparam, cast, func, literal, text
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import QueryableAttribute

# First key of the two-key advisory lock space: "node events".
_NAMESPACE = 0x6D666E64  # "mfnd"


def node_xact_lock(node_id: uuid.UUID | QueryableAttribute[uuid.UUID]) -> ColumnElement[None]:
    """Select this to wait for the node's lock; released at commit or rollback.

    hashtext collisions only make two nodes share a lock, never break exclusion.
    """
    key = literal(str(node_id)) if isinstance(node_id, uuid.UUID) else cast(node_id, Text)
    return func.pg_advisory_xact_lock(_NAMESPACE, func.hashtext(key))


def node_try_xact_lock(node_id: uuid.UUID) -> ColumnElement[bool]:
    """Like node_xact_lock, but answers false at once when someone else holds it."""
    return func.pg_try_advisory_xact_lock(_NAMESPACE, func.hashtext(literal(str(node_id))))


_TRY_NODES_OF_CREDENTIALS: Final = text(
    """
    SELECT c.id, pg_try_advisory_xact_lock(:namespace, hashtext(c.node_id::text)) AS locked
    FROM node_credentials AS c WHERE c.id = ANY(:ids)
    """
).bindparams(bindparam("ids", type_=ARRAY(UUID(as_uuid=True))))


async def try_lock_nodes_of_credentials(
    session: AsyncSession, credential_ids: Sequence[uuid.UUID]
) -> set[uuid.UUID]:
    """Take the node lock (node_xact_lock's) of every credential's node that no one else
    holds now, without waiting; the credential ids whose node this transaction now
    holds. Never waiting, a batch of many nodes neither queues behind each node's own
    transactions (a convoy: measured at 5,000 nodes, one second a batch) nor deadlocks
    with another batch."""
    rows = await session.execute(
        _TRY_NODES_OF_CREDENTIALS, {"namespace": _NAMESPACE, "ids": list(credential_ids)}
    )
    return {row.id for row in rows if row.locked}
