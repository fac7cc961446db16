"""Protocol steps shared by tests: what an operator and an agent send, over real HTTP."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

# The protocol's paths, re-exported for the tests that import them from here.
from schemas.protocol import (
    AUDIT,
    DEAD_LETTERS,
    ENROLL,
    FLEET,
    HEARTBEAT,
    INVENTORY,
    NODES,
    TELEMETRY,
    TOKENS,
)
from store.fleet import PartitionBreaker
from store.liveness import LivenessThresholds
from tests.api_server import RunningApi

__all__ = [
    "AUDIT",
    "DEAD_LETTERS",
    "ENROLL",
    "FLEET",
    "HEARTBEAT",
    "INVENTORY",
    "NODES",
    "TELEMETRY",
    "TOKENS",
]

# Liveness thresholds short enough for a test to watch a silent node go stale, then
# offline (the tests start their API with the same ones, for what it reports).
THRESHOLDS = LivenessThresholds(stale_after_s=1.0, offline_after_s=2.0)
# A test's whole fleet goes silent at once on purpose; the partition breaker would hold
# it (tests/test_fleet_safety.py), so with this one it never trips.
NO_BREAKER = PartitionBreaker(min_nodes=10**9)


@dataclass(frozen=True)
class EnrolledNode:
    node_id: str
    credential: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.credential}"}


def now() -> datetime:
    return datetime.now(UTC)


def create_token(client: httpx.Client, api: RunningApi, **body: Any) -> str:
    response = client.post(TOKENS, json=body, headers=api.admin_headers)
    assert response.status_code == 201, response.text
    secret: str = response.json()["secret"]
    return secret


def enroll_body(token: str, hostname: str = "gpu-host-1", **extra: Any) -> dict[str, Any]:
    return {
        "enrollment_token": token,
        "protocol_version": 1,
        "agent_version": "1.0.0",
        "hostname": hostname,
        "capabilities": ["hardware.inventory", "hardware.telemetry"],
        **extra,
    }


def enroll(
    client: httpx.Client, api: RunningApi, hostname: str = "gpu-host-1", **token_body: Any
) -> EnrolledNode:
    token = create_token(client, api, **token_body)
    response = client.post(ENROLL, json=enroll_body(token, hostname))
    assert response.status_code == 201, response.text
    data = response.json()
    return EnrolledNode(node_id=data["node_id"], credential=data["credential"])


def heartbeat_body(node_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "node_id": node_id,
        "protocol_version": 1,
        "agent_version": "1.0.0",
        "capabilities": ["hardware.inventory", "hardware.telemetry"],
        **extra,
    }


def gpu(index: int, gpu_uuid: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "uuid": gpu_uuid or f"GPU-{uuid.uuid4()}",
        "index": index,
        "name": "NVIDIA H200",
        "pci_bus_id": f"00000000:{index + 1:02x}:00.0",
        "memory_total_bytes": 141 * 2**30,
        "driver_version": "570.86",
        "cuda_version": "12.8",
        **extra,
    }


def inventory_body(
    node_id: str,
    sequence: int,
    *,
    observed_at: datetime | None = None,
    complete: bool = True,
    gpus: list[dict[str, Any]] | None = None,
    hostname: str = "gpu-host-1",
) -> dict[str, Any]:
    return {
        "node_id": node_id,
        "sequence": sequence,
        "observed_at": (observed_at or now()).isoformat(),
        "complete": complete,
        "host": {"hostname": hostname, "os": "Linux", "cpu_count": 32, "ram_total_bytes": 2**38},
        "gpus": gpus or [],
    }


def telemetry_body(
    node_id: str,
    sequence: int,
    *,
    observed_at: datetime | None = None,
    gpu_uuids: list[str] | None = None,
) -> dict[str, Any]:
    return {
        "node_id": node_id,
        "sequence": sequence,
        "observed_at": (observed_at or now()).isoformat(),
        "ram_total_bytes": 2**38,
        "ram_used_bytes": 2**36,
        "storage": [{"path": "/", "total_bytes": 2**40, "used_bytes": 2**39}],
        "gpus": [
            {
                "uuid": u,
                "utilization_percent": 50.0,
                "memory_used_bytes": 2**33,
                "temperature_c": 60.0,
                "power_w": 300.0,
            }
            for u in (gpu_uuids or [])
        ],
    }


async def released_together(count: int, send: Any) -> list[httpx.Response]:
    """Start `count` requests, then release them at once through one event."""
    go = asyncio.Event()
    ready = 0

    async def one(i: int) -> httpx.Response:
        nonlocal ready
        ready += 1
        await go.wait()
        response: httpx.Response = await send(i)
        return response

    tasks = [asyncio.ensure_future(one(i)) for i in range(count)]
    while ready < count:
        await asyncio.sleep(0)
    go.set()
    return list(await asyncio.gather(*tasks))
