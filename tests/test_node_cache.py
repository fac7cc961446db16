"""The node cache's guard against storing a read that a notification overtook
(api/node_cache.py), per node: a change to one node never keeps another out of the cache.

These drive the cache's own notification entry points in process; the end-to-end
refusal across two API processes is tests/test_refusal_across_apis.py.
"""

from __future__ import annotations

import uuid

import pytest

from api.node_cache import CachedNode, NodeCache
from store import secrets

pytestmark = pytest.mark.fast


def _entry(node_id: uuid.UUID) -> tuple[CachedNode, secrets.PresentedSecret]:
    presented = secrets.PresentedSecret(id=uuid.uuid4(), secret=f"secret-{node_id}")
    entry = CachedNode(
        node_id=node_id,
        credential_id=presented.id,
        digest=secrets.digest(presented.secret),
        agent_version="0.1.0",
        protocol_version=1,
        capabilities=("hardware.inventory",),
    )
    return entry, presented


def _listening() -> NodeCache:
    cache = NodeCache()
    cache._on_connected(True)
    return cache


def test_a_read_overtaken_by_its_nodes_notification_is_not_stored() -> None:
    cache = _listening()
    node = uuid.uuid4()
    entry, presented = _entry(node)
    began = cache.generation
    cache._on_payload(str(node))  # e.g. a revocation committed while the read ran
    cache.remember(entry, began)
    assert cache.lookup(presented) is None
    # A read that began after the notification saw the change: stored.
    cache.remember(entry, cache.generation)
    assert cache.lookup(presented) == entry


def test_other_nodes_notifications_do_not_keep_a_read_out() -> None:
    cache = _listening()
    entry, presented = _entry(uuid.uuid4())
    began = cache.generation
    for _ in range(100):
        cache._on_payload(str(uuid.uuid4()))
    cache.remember(entry, began)
    assert cache.lookup(presented) == entry


def test_a_notification_drops_the_entry_and_a_wrong_secret_never_matches() -> None:
    cache = _listening()
    node = uuid.uuid4()
    entry, presented = _entry(node)
    cache.remember(entry, cache.generation)
    assert cache.lookup(secrets.PresentedSecret(id=presented.id, secret="wrong")) is None
    cache._on_payload(str(node))
    assert cache.lookup(presented) is None
    assert len(cache) == 0


def test_reads_from_before_a_reconnect_are_not_stored() -> None:
    cache = _listening()
    entry, presented = _entry(uuid.uuid4())
    began = cache.generation
    cache._on_connected(False)  # notifications may be missed from here on
    cache.remember(entry, began)
    assert cache.lookup(presented) is None
    cache._on_connected(True)
    cache.remember(entry, began)
    assert cache.lookup(presented) is None
    cache.remember(entry, cache.generation)
    assert cache.lookup(presented) == entry


def test_an_overflowing_notification_map_refuses_reads_from_before_it() -> None:
    cache = NodeCache(max_entries=10)
    cache._on_connected(True)
    entry, presented = _entry(uuid.uuid4())
    began = cache.generation
    for _ in range(11):
        cache._on_payload(str(uuid.uuid4()))
    # The map forgot which nodes changed: an older read could be stale, so it is refused.
    cache.remember(entry, began)
    assert cache.lookup(presented) is None
    cache.remember(entry, cache.generation)
    assert cache.lookup(presented) == entry
