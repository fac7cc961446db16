"""The heap keeper (api/heap.py): a long full collection freezes what survived it; a
short one does not; after thaw_after_s the heap is thawed instead."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest

from api.heap import HeapKeeper

pytestmark = pytest.mark.fast


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    try:
        yield loop
    finally:
        gc.unfreeze()
        loop.close()


def _collect(loop: asyncio.AbstractEventLoop, keeper: HeapKeeper) -> None:
    keeper.install()
    try:
        gc.collect()
        # The freeze is scheduled on the loop, not done inside the collector.
        loop.run_until_complete(asyncio.sleep(0.01))
    finally:
        keeper.remove()


def test_what_survives_a_long_full_collection_is_frozen(
    loop: asyncio.AbstractEventLoop,
) -> None:
    survivors = [[i] for i in range(50_000)]
    keeper = HeapKeeper(loop, long_pause_s=0.0)
    _collect(loop, keeper)
    assert keeper.freezes == 1
    assert gc.get_freeze_count() >= len(survivors)


def test_a_short_full_collection_freezes_nothing(loop: asyncio.AbstractEventLoop) -> None:
    keeper = HeapKeeper(loop, long_pause_s=60.0)
    _collect(loop, keeper)
    assert keeper.freezes == 0
    assert gc.get_freeze_count() == 0


def test_after_thaw_after_s_the_heap_is_thawed_instead(
    loop: asyncio.AbstractEventLoop,
) -> None:
    gc.freeze()
    assert gc.get_freeze_count() > 0
    keeper = HeapKeeper(loop, long_pause_s=0.0, thaw_after_s=0.0)
    _collect(loop, keeper)
    assert keeper.freezes == 0
    assert gc.get_freeze_count() == 0
