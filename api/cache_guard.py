"""What the API's LISTEN-kept caches share (api/node_cache.py, api/gateway/cache.py): the
guard that keeps a read from storing what a notification already retired, and the
LISTEN task that keeps a cache true for the lifespan of the process.

The race the guard closes: a request reads a row, the row changes and its notification
arrives, then the request stores what it read. Every notification bumps `generation` and
records it against its key; a read is stored only if no notification for *that key*
came since it began. Per key, not global: at fleet scale some node changes every few
milliseconds, and a global guard refused nearly every read (api/node_cache.py).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Protocol

from store.notify import Listener, listening_with


class ChangeGuard:
    def __init__(self, max_keys: int) -> None:
        self.generation = 0
        self._max_keys = max_keys
        # Per key: the generation of its last notification. Reads that began before
        # `_floor` (a clear, or this map overflowing) are never stored.
        self._notified: dict[uuid.UUID, int] = {}
        self._floor = 0

    def admits(self, key: uuid.UUID, began: int) -> bool:
        """Whether a read of `key` that began at generation `began` may be stored."""
        return began >= self._floor and self._notified.get(key, -1) <= began

    def changed(self, key: uuid.UUID) -> None:
        self.generation += 1
        if len(self._notified) >= self._max_keys:
            self._notified.clear()
            self._floor = self.generation
        self._notified[key] = self.generation

    def clear(self) -> None:
        """Everything may have changed: no read that began before now is stored."""
        self.generation += 1
        self._floor = self.generation
        self._notified.clear()


class ListeningCache(Protocol):
    closing: bool

    def _on_payload(self, payload: str) -> None: ...
    def _on_connected(self, up: bool) -> None: ...


@contextlib.asynccontextmanager
async def kept_by_listen(
    database_url: str, channel: str, cache: ListeningCache
) -> AsyncIterator[None]:
    """LISTEN on `channel` for the cache until the block ends."""
    # Bound late, so that a test can hold the notifications back and show that what the
    # process itself changed needs none of them (tests/test_rotation_race.py).
    listener = Listener(
        on_payload=lambda payload: cache._on_payload(payload),
        on_connected=lambda up: cache._on_connected(up),
    )
    async with listening_with(database_url, channel, listener):
        try:
            yield
        finally:
            # Before the listener stops, so its last disconnect is not warned of as lost.
            cache.closing = True
