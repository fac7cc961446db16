"""Test actors, declared on a given broker (no module-level broker or state)."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dramatiq

from broker.jetstream import AsyncResource, JetStreamBroker
from tests.broker.effects import EffectLog

# A worker started with this variable holds every `hold` message that long (the victim
# of the SIGKILL test); others run it at once.
HOLD_ENV = "MF_TEST_HOLD_S"


@dataclass(frozen=True)
class Actors:
    record: dramatiq.Actor[Any, Any]
    record_async: dramatiq.Actor[Any, Any]
    hold: dramatiq.Actor[Any, Any]
    fail: dramatiq.Actor[Any, Any]
    flaky: dramatiq.Actor[Any, Any]


class LoopProbe:
    """A shared async resource: remembers the loop it was opened on and its disposal."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.closed = False

    async def close(self) -> None:
        self.closed = True


async def open_probe() -> LoopProbe:
    return LoopProbe()


def probe_resource() -> AsyncResource[LoopProbe]:
    return AsyncResource("probe", open_probe, LoopProbe.close)


def declare_test_actors(
    broker: JetStreamBroker, effects: EffectLog, probe: AsyncResource[LoopProbe] | None = None
) -> Actors:
    @dramatiq.actor(broker=broker)
    def record(key: str) -> None:
        effects.write("done", key)

    @dramatiq.actor(broker=broker)
    async def record_async(key: str) -> None:
        if probe is not None:
            # The resource was opened on the loop this actor runs on.
            assert probe.get().loop is asyncio.get_running_loop()
        await asyncio.sleep(0)
        effects.write("done", key)

    @dramatiq.actor(broker=broker)
    def hold(key: str, sleep_s: float = 0.0) -> None:
        effects.write("start", key)
        time.sleep(max(sleep_s, float(os.environ.get(HOLD_ENV, "0"))))
        effects.write("done", key)

    @dramatiq.actor(broker=broker, max_retries=2, min_backoff=200, max_backoff=2000)
    def fail(key: str) -> None:
        effects.write("attempt", key)
        raise RuntimeError(f"{key} always fails")

    @dramatiq.actor(broker=broker, max_retries=0)
    def flaky(key: str, flag: str) -> None:
        effects.write("attempt", key)
        if not Path(flag).exists():
            raise ValueError(f"{key}: flag not set")
        effects.write("done", key)

    return Actors(record, record_async, hold, fail, flaky)
