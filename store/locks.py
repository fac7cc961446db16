"""Per-node advisory locks.

Every transaction that may emit events for a node takes this lock before it reads
the node's state, so two transactions of one node never interleave their outbox
inserts: the outbox position order (which the relay publishes in) is then each
node's commit order.
"""

from __future__ import annotations

import uuid

from sqlalchemy import ColumnElement, Text, cast, func, literal
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
