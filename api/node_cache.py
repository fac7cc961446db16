"""What an API process remembers about admitted nodes, so that a routine heartbeat needs
no database read: the credential's digest and the node's agent facts, for online nodes.

Correct only while it hears every change. Every change that could refuse a credential
or make a heartbeat more than routine (revocation, rotation, disable, decommission, a
recorded liveness change away from online, new agent facts) NOTIFYs the node's id when
it commits (migrations 0006, 0012), and the entry is dropped: every API replica forgets it within
milliseconds, so a revoked node is refused everywhere well inside a second. While the
LISTEN connection is down the cache holds nothing and answers nothing, and it starts
empty again once reconnected (notifications may have been missed meanwhile).

The process that commits a change to a node's standing (revocation, rotation, disable,
decommission) does not wait for its own notification: it drops the node right after the
commit, before it answers (api/deps.py, store/nodes.py `standing_changed`), so an
operator who rotated a credential is never answered by a replica that still takes it.

A race to avoid: a request reads the node from the database, a revocation commits and
its notification arrives, then the request stores what it read. Every notification bumps
`generation` and records it against its node; a read is stored only if no notification
for *that node* came since it began. Per node, not global: at fleet scale some node
changes every few milliseconds, and a global guard refused nearly every read, so every
heartbeat stayed transactional, got slower, went stale and notified again (the collapse
`ops/bench/fleet.py` showed at 2,500 nodes).
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from api.cache_guard import ChangeGuard, kept_by_listen
from store import secrets
from store.node_credentials import AuthenticatedNode
from store.notify import NODE_CHANGES_CHANNEL

logger = logging.getLogger("modelforge.api.node_cache")


@dataclass(frozen=True)
class CachedNode:
    node_id: uuid.UUID
    credential_id: uuid.UUID
    digest: bytes
    agent_version: str
    protocol_version: int
    # Sorted, as heartbeats record them.
    capabilities: tuple[str, ...]


class AgentFacts(Protocol):
    """What a node says of its agent: a heartbeat's request, or the node as admitted."""

    @property
    def agent_version(self) -> str: ...
    @property
    def protocol_version(self) -> int: ...
    @property
    def capabilities(self) -> Sequence[str]: ...


def cache_entry(
    node: AuthenticatedNode, digest: bytes, facts: AgentFacts | None = None
) -> CachedNode:
    """The node as a committed heartbeat leaves it: online, its credential's digest, and
    the agent facts just recorded (`facts`: a heartbeat's; by default the node's own)."""
    recorded = node if facts is None else facts
    return CachedNode(
        node_id=node.node_id,
        credential_id=node.credential_id,
        digest=digest,
        agent_version=recorded.agent_version,
        protocol_version=recorded.protocol_version,
        capabilities=tuple(sorted(set(recorded.capabilities))),
    )


class NodeCache:
    def __init__(self, max_entries: int = 200_000) -> None:
        self._entries: dict[uuid.UUID, CachedNode] = {}
        self._by_node: dict[uuid.UUID, set[uuid.UUID]] = {}
        self._max_entries = max_entries
        self._guard = ChangeGuard(max_entries)
        self.listening = False
        self.closing = False

    @property
    def generation(self) -> int:
        return self._guard.generation

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, presented: secrets.PresentedSecret) -> CachedNode | None:
        """The entry when the presented secret matches it (constant time); otherwise None,
        and the caller asks the database, which also gives every refusal."""
        if not self.listening:
            return None
        entry = self._entries.get(presented.id)
        if entry is None or not secrets.matches(presented.secret, entry.digest):
            return None
        return entry

    def remember(self, entry: CachedNode, generation: int) -> None:
        """Store what a read that began at `generation` found, unless something changed
        since (see the module docstring)."""
        if not self.listening or not self._guard.admits(entry.node_id, generation):
            return
        if len(self._entries) >= self._max_entries and entry.credential_id not in self._entries:
            return  # full: the rest take the database path, as before the cache
        self._entries[entry.credential_id] = entry
        self._by_node.setdefault(entry.node_id, set()).add(entry.credential_id)

    def forget_node(self, node_id: uuid.UUID) -> None:
        self._guard.changed(node_id)
        for credential_id in self._by_node.pop(node_id, ()):
            self._entries.pop(credential_id, None)

    def _on_payload(self, payload: str) -> None:
        try:
            node_id = uuid.UUID(payload)
        except ValueError:
            self._clear()
            return
        self.forget_node(node_id)

    def _on_connected(self, up: bool) -> None:
        self._clear()
        self.listening = up
        if not up and not self.closing:
            logger.warning("node change notifications lost: the node cache is off until back")

    def _clear(self) -> None:
        self._guard.clear()
        self._entries.clear()
        self._by_node.clear()


@contextlib.asynccontextmanager
async def node_cache(database_url: str) -> AsyncIterator[NodeCache]:
    """A cache kept true by LISTEN, for the lifespan of the API process."""
    cache = NodeCache()
    async with kept_by_listen(database_url, NODE_CHANGES_CHANNEL, cache):
        yield cache
