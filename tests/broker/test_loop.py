"""The broker's loop bridge says which bound ended an operation: its own wait, or a
timeout the operation raised itself (nats-py's request timeout)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import nats.errors
import pytest

from broker.jetstream.errors import connection_failed
from broker.jetstream.loop import LoopThread, WaitExpired

pytestmark = pytest.mark.fast


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    thread = LoopThread("test-loop")
    thread.start()
    yield thread
    thread.stop()


def test_a_timeout_raised_by_the_operation_is_not_relabelled_as_the_wait(
    loop: LoopThread,
) -> None:
    async def request() -> None:
        raise nats.errors.TimeoutError

    with pytest.raises(nats.errors.TimeoutError) as raised:
        loop.run(request(), 20.0)
    assert not isinstance(raised.value, WaitExpired)
    message = str(connection_failed(raised.value))
    assert "within 20.0s" not in message
    assert "nats.errors.TimeoutError: nats: timeout (the operation's own timeout)" in message


def test_the_wait_expiring_says_so(loop: LoopThread) -> None:
    async def hangs() -> None:
        await asyncio.sleep(30)

    with pytest.raises(WaitExpired, match=r"did not finish within 0\.2s") as raised:
        loop.run(hangs(), 0.2)
    assert isinstance(raised.value, TimeoutError)  # callers catching TimeoutError still do
    message = str(connection_failed(raised.value))
    assert "WaitExpired: broker operation did not finish within 0.2s" in message
    assert "own timeout" not in message
