"""A fleet written straight into PostgreSQL as the API leaves it, for the rollup's tests
(tests/test_rollup_*.py, tests/test_admin_overview.py): nodes of every liveness, two GPUs
each, their last telemetry, and services with replicas. One statement per table, so
10,000 nodes take seconds; `expected` is what the overview must count of it. And the
gateway's usage as it adds it (`usage_delta`, `ttft_counts`)."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from schemas.usage import empty_buckets, ttft_bucket
from store.engine import make_engine, make_sessionmaker
from store.rollup import usage
from store.rollup.usage import UsageDelta
from store.services.tables import Service, ServiceReplica
from tests.services import run_async


def ttft_counts(seconds: float, count: int) -> tuple[int, ...]:
    """`count` times to first token of `seconds`, as bucket counts."""
    buckets = list(empty_buckets())
    buckets[ttft_bucket(seconds)] = count
    return tuple(buckets)


def usage_delta(
    minute: datetime,
    client: uuid.UUID,
    model: str,
    outcome: str = "ok",
    requests: int = 1,
    ttft: tuple[int, ...] | None = None,
    *,
    prompt_each: int = 10,
    completion_each: int = 100,
) -> UsageDelta:
    """`requests` invokes of one minute, client, model and outcome, each of
    `prompt_each` and `completion_each` tokens; `ttft`: their first tokens' buckets."""
    buckets = ttft or empty_buckets()
    return UsageDelta(
        minute=minute,
        client_id=client,
        model=model,
        outcome=outcome,
        requests=requests,
        prompt_tokens=prompt_each * requests,
        completion_tokens=completion_each * requests,
        ttft_count=sum(buckets),
        ttft_sum_s=0.0,
        ttft_buckets=buckets,
    )


def write_usage(database_url: str, deltas: list[UsageDelta]) -> None:
    """Usage rows written as the gateway's flush writes them (store.rollup.usage.add),
    from a synchronous test, into a running API's database."""

    async def add() -> None:
        engine = make_engine(database_url, pool_size=1)
        try:
            async with make_sessionmaker(engine)() as session, session.begin():
                await usage.add(session, deltas)
        finally:
            await engine.dispose()

    run_async(add)


GiB = 1 << 30
GPU_TOTAL = 80 * GiB

# Node i: offline when i % 10 == 0, stale when i % 10 == 1, online otherwise; disabled
# when i % 50 == 2, decommissioned when i % 100 == 3; its GPU 1 missing when i % 25 == 4.
_SEED = [
    """
    INSERT INTO nodes (id, hostname, enabled, protocol_version, agent_version, liveness,
                       last_heartbeat_at, decommissioned_at)
    SELECT md5(:tag || i)::uuid, 'rollup-' || :tag || '-' || i, i % 50 <> 2, 1, 'test',
        CASE i % 10 WHEN 0 THEN 'offline' WHEN 1 THEN 'stale' ELSE 'online' END,
        -- A last heartbeat that agrees with the liveness under the default thresholds
        -- (stale after 30 s, offline after 90 s): a worker's liveness sweep leaves it.
        now() - CASE i % 10 WHEN 0 THEN interval '1 day' WHEN 1 THEN interval '60 s'
                                 ELSE interval '0 s' END,
        CASE WHEN i % 100 = 3 THEN now() END
    FROM generate_series(1, :nodes) AS i
    """,
    """
    INSERT INTO gpus (node_id, uuid, index, name, pci_bus_id, memory_total_bytes,
                      missing_since)
    SELECT md5(:tag || i)::uuid, 'GPU-' || md5(:tag || i || '-' || g), g, 'H100',
        'pci-' || g, :gpu_total,
        CASE WHEN g = 1 AND i % 25 = 4 THEN now() END
    FROM generate_series(1, :nodes) AS i, generate_series(0, 1) AS g
    """,
    """
    INSERT INTO node_streams (node_id, stream, good_sequence, good_received_at, good_payload)
    SELECT md5(:tag || i)::uuid, 'telemetry', 1, statement_timestamp(), jsonb_build_object(
        'ram_total_bytes', 64::bigint << 30, 'ram_used_bytes', (i % 64)::bigint << 30,
        'storage', '[]'::jsonb,
        'gpus', jsonb_build_array(
            jsonb_build_object('uuid', 'GPU-' || md5(:tag || i || '-0'),
                'utilization_percent', i % 100, 'memory_used_bytes', (i % 80)::bigint << 30,
                'temperature_c', 40 + i % 40, 'power_w', 100),
            jsonb_build_object('uuid', 'GPU-' || md5(:tag || i || '-1'),
                'utilization_percent', 50, 'memory_used_bytes', 1::bigint << 30,
                'temperature_c', 30, 'power_w', 50)))
    FROM generate_series(1, :nodes) AS i
    """,
]


def node_id(tag: str, i: int) -> uuid.UUID:
    return uuid.UUID(hashlib.md5(f"{tag}{i}".encode()).hexdigest())  # noqa: S324


@dataclass(frozen=True)
class Expected:
    nodes: dict[str, int]
    gpus: int
    gpu_memory_total_bytes: int
    gpu_memory_used_bytes: int
    gpu_utilization_percent: float


def expected(count: int) -> Expected:
    nodes = {"online": 0, "stale": 0, "offline": 0, "disabled": 0}
    gpus = used = 0
    utilization: list[float] = []
    for i in range(1, count + 1):
        if i % 100 == 3:
            continue
        liveness = {0: "offline", 1: "stale"}.get(i % 10, "online")
        enabled = i % 50 != 2
        nodes[liveness if enabled else "disabled"] += 1
        if not enabled or liveness == "offline":
            continue
        gpus += 1 if i % 25 == 4 else 2
        used += (i % 80) * GiB + GiB
        utilization += [float(i % 100), 50.0]
    return Expected(
        nodes=nodes,
        gpus=gpus,
        gpu_memory_total_bytes=gpus * GPU_TOTAL,
        gpu_memory_used_bytes=used,
        gpu_utilization_percent=sum(utilization) / len(utilization),
    )


async def seed_fleet(sessions: async_sessionmaker[AsyncSession], count: int, tag: str) -> None:
    values = {"tag": tag, "nodes": count, "gpu_total": GPU_TOTAL}
    async with sessions() as session, session.begin():
        for statement in _SEED:
            await session.execute(text(statement), values)
    async with sessions() as session, session.begin():
        await session.execute(text("ANALYZE"))


def _service(name: str, replicas: int, state: str = "active") -> Service:
    now = datetime.now(UTC)
    return Service(
        id=uuid.uuid4(),
        name=name,
        roles=[],
        state=state,
        template={},
        generation=1,
        replicas=replicas,
        placement={},
        strategy={},
        rollout_state="complete",
        backoff={},
        created_at=now,
        updated_at=now,
    )


async def seed_services(
    sessions: async_sessionmaker[AsyncSession], tag: str, nodes: list[int]
) -> dict[str, int]:
    """One service of each health, replicas on the given nodes' GPU 0 (at least 4 node
    numbers, each used once); what the overview must count."""
    # (name, desired, ready replicas, other replicas, state)
    shapes = [
        ("ready", 2, 2, 0, "active"),
        ("degraded", 2, 1, 1, "active"),
        ("unavailable", 1, 0, 1, "active"),
        ("idle", 0, 0, 0, "active"),
        ("deleting", 1, 0, 0, "deleting"),
        ("deleted", 1, 0, 0, "deleted"),
    ]
    free = iter(nodes)
    now = datetime.now(UTC)
    async with sessions() as session, session.begin():
        for name, desired, ready, other, state in shapes:
            service = _service(f"{tag}-{name}", desired, state)
            session.add(service)
            await session.flush()
            for phase in ["ready"] * ready + ["loading"] * other:
                session.add(
                    ServiceReplica(
                        id=uuid.uuid4(),
                        service_id=service.id,
                        generation=1,
                        node_id=node_id(tag, next(free)),
                        device_id="gpu:0",
                        phase=phase,
                        created_at=now,
                        updated_at=now,
                        phase_changed_at=now,
                    )
                )
    return {"ready": 1, "degraded": 1, "unavailable": 1, "idle": 1, "deleting": 1}
