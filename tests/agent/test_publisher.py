"""The publishing loops in-process against the real API: inventory on change, an NVML
failure never reported as vanished GPUs, and nothing sent after a stop."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from agent.client import ProtocolClient, make_http_client
from agent.collectors.base import GpuCollection
from agent.collectors.host import HostTelemetry
from agent.collectors.simulated import SimulatedCollector
from agent.publisher import Publisher, Timing
from agent.state import Sequences
from schemas.agent import GpuTelemetry, HostFacts
from tests.api_processes import heartbeats_answered
from tests.api_server import RunningApi
from tests.flows import ENROLL, NODES, TOKENS, enroll_body

ApiFactory = Callable[..., RunningApi]


class SwitchableCollector:
    """Simulated GPUs whose visibility the test controls."""

    name = "switchable"

    def __init__(self) -> None:
        self.inner = SimulatedCollector(str(uuid.uuid4()), 2)
        self.visible = 2
        self.failing = False

    def inventory(self) -> GpuCollection:
        if self.failing:
            return GpuCollection(complete=False, problem="NVML failing: GPU is lost")
        return GpuCollection(gpus=self.inner.inventory().gpus[: self.visible])

    def telemetry(self) -> list[GpuTelemetry]:
        return [] if self.failing else self.inner.telemetry()[: self.visible]

    def close(self) -> None:
        return None


class FixedHost:
    def facts(self) -> HostFacts:
        return HostFacts(hostname="in-process", cpu_count=8, ram_total_bytes=2**34)

    def telemetry(self) -> HostTelemetry:
        return HostTelemetry(ram_total_bytes=2**34, ram_used_bytes=2**33, storage=[])


async def eventually(check: Callable[[], Awaitable[Any]], timeout_s: float = 15) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out: {value!r}"
        await asyncio.sleep(0.05)


async def test_inventory_follows_changes_and_a_failing_collector_keeps_the_gpus(
    api_factory: ApiFactory,
) -> None:
    api = api_factory(heartbeat_interval_s=0.2)
    admin = httpx.AsyncClient(base_url=api.base_url, headers=api.admin_headers, timeout=30)
    token = (await admin.post(TOKENS, json={})).json()["secret"]
    enrolled = (await admin.post(ENROLL, json=enroll_body(token))).json()
    node_id = enrolled["node_id"]

    async def detail() -> dict[str, Any]:
        response = await admin.get(f"{NODES}/{node_id}")
        body: dict[str, Any] = response.json()
        return body

    collector = SwitchableCollector()
    async with make_http_client(api.base_url, trust_env=False) as http:
        publisher = Publisher(
            client=ProtocolClient(http, enrolled["credential"]),
            node_id=uuid.UUID(node_id),
            sequences=Sequences(None),
            collector=collector,
            host=FixedHost(),
            timing=Timing(
                telemetry_interval_s=0.2,
                inventory_check_interval_s=0.1,
                inventory_interval_s=60,
                retry_initial_s=0.05,
                retry_max_s=0.2,
            ),
        )
        stop = asyncio.Event()
        running = asyncio.create_task(publisher.run(stop))
        try:

            async def gpus(missing: bool | None = None) -> dict[str, bool]:
                return {g["uuid"]: g["missing"] for g in (await detail())["gpus"]}

            both = await eventually(lambda: _with_len(gpus(), 2))
            assert not any(both.values())
            sent = publisher.stats.sent["inventory"]

            # NVML fails: the inventory says complete=false; no GPU becomes missing.
            collector.failing = True

            async def incomplete() -> bool:
                inventory = (await detail())["inventory"]
                return inventory is not None and inventory["complete"] is False

            await eventually(incomplete)
            assert not any((await gpus()).values())
            assert publisher.stats.sent["inventory"] == sent + 1  # sent on change, once
            await asyncio.sleep(0.5)  # a window for a resend that must not come: no wait
            assert publisher.stats.sent["inventory"] == sent + 1  # not again: unchanged

            # Back, with one GPU really gone: a complete inventory marks it missing.
            collector.failing, collector.visible = False, 1

            async def one_missing() -> bool:
                return sorted((await gpus()).values()) == [False, True]

            await eventually(one_missing)
        finally:
            stop.set()
            assert await asyncio.wait_for(running, 10) is None
    after_stop = dict(publisher.stats.sent)
    with api.client() as metrics:
        answered = heartbeats_answered(metrics)
        # A window for what must not happen (a heartbeat after the stop): not a wait.
        await asyncio.sleep(0.8)
        assert dict(publisher.stats.sent) == after_stop
        assert heartbeats_answered(metrics) == answered
    assert publisher.stats.failed == 0
    await admin.aclose()


async def _with_len(values: Awaitable[dict[str, bool]], n: int) -> dict[str, bool] | None:
    found = await values
    return found if len(found) == n else None
