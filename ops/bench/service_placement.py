"""The scheduler's placement decision over a large fleet (issue 32).

    python ops/bench/service_placement.py [--nodes 10000 --decisions 200 --replicas 100]
    python -m ops.bench.service_placement

Embedded PostgreSQL (or MODELFORGE_DATABASE_URL), migrated, then `--nodes` nodes written
straight into it as the API leaves them: a mix of GPU nodes (1 to 8 devices of 24 to 80
GiB, free memory spread over the range), CPU nodes, labels (10 zones, two pools), 5 %
offline, 1 % disabled, 3 % without a runtime report, 2 % holding the artifact, 10 %
with a device busy with another service's replica, and probe evidence on a few. Then:

* **decide**: `store/services/placement.py: decide` for a service of any zone on CUDA
  devices, `--decisions` times, each in its own transaction as the reconciler runs it;
  p50/p99 in ms (goal: p99 < 50 ms over 10,000 nodes); then back to back for
  `--sustain-s` (longer than two snapshot ages, so the decisions that take a new
  snapshot are counted in);
* **a service of `--replicas` replicas**: decide, then insert the replica row and
  commit, as the reconciler does, until all are placed (goal: 100 in under 10 s);
* a selective service (one zone, a CPU device) for comparison: nothing fits, and a
  refusal is answered only from a snapshot at most REFUSE_AGE_S old;
* the snapshot taken again (store/services/snapshot.py: the fleet listing, reports
  parsed only when their version changed), which a decision pays at most every
  MAX_AGE_S (and a refusal every REFUSE_AGE_S).

`placement_figures(database_url, nodes, decisions)` is the same, for
ops/bench/services.py: it adds its nodes to the database it is given.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import heartbeats as hb  # sibling bench module: the embedded database
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from store.deployments import tables as _deployments  # noqa: F401 (the FK targets)
from store.engine import make_engine, make_sessionmaker
from store.services.estimate import GiB
from store.services.placement import decide
from store.services.snapshot import MAX_AGE_S, FleetCache
from store.services.tables import Service, ServiceReplica
from tests.placement_flows import COMMIT, DIGEST, PATH, REPO, sized_template

ENV = "e" * 64

# One statement per table: generate_series and a few hashes make the mix reproducible.
_SEED = [
    """
    INSERT INTO nodes (id, hostname, labels, enabled, protocol_version, agent_version,
                       liveness, last_heartbeat_at)
    SELECT md5(:tag || i)::uuid, 'bench-' || :tag || '-' || i,
        jsonb_build_object('zone', 'z' || (i % 10),
                           'pool', CASE WHEN i % 4 = 0 THEN 'cpu' ELSE 'gpu' END),
        i % 100 <> 1, 1, 'bench',
        CASE WHEN i % 20 = 2 THEN 'offline' ELSE 'online' END, now()
    FROM generate_series(1, :nodes) AS i
    """,
    """
    INSERT INTO node_streams (node_id, stream, good_sequence, good_payload)
    SELECT md5(:tag || i)::uuid, 'runtime', 1, jsonb_build_object(
        'environments', jsonb_build_array(jsonb_build_object(
            'binary_sha256', CAST(:env AS text), 'version', 'b1', 'backend', 'cuda')),
        'devices', CASE WHEN i % 4 = 0 THEN jsonb_build_array(jsonb_build_object(
                'device_id', 'cpu', 'backend', 'cpu', 'queue_depth', 0,
                'memory_total_bytes', 64::bigint << 30,
                'memory_free_bytes', ((i * 7) % 64)::bigint << 30))
            ELSE (SELECT jsonb_agg(jsonb_build_object(
                'device_id', 'gpu:' || g, 'backend', 'cuda', 'queue_depth', 0,
                'memory_total_bytes', 80::bigint << 30,
                'memory_free_bytes', (((i * 7919 + g * 104729) % 80))::bigint << 30))
                FROM generate_series(0, i % 8) AS g)
            END,
        'served_models', '[]'::jsonb, 'loaded_models', '[]'::jsonb)
    FROM generate_series(1, :nodes) AS i WHERE i % 33 <> 3
    """,
    """
    INSERT INTO node_streams (node_id, stream, good_sequence, good_payload)
    SELECT md5(:tag || i)::uuid, 'inventory', 1,
        jsonb_build_object('host', jsonb_build_object('artifact_roots',
            CASE WHEN i % 50 = 4 THEN '[]'::jsonb ELSE '["/models"]'::jsonb END))
    FROM generate_series(1, :nodes) AS i
    """,
    """
    INSERT INTO jobs (id, kind, node_id, state, spec, max_attempts, available_at,
                      created_at, updated_at)
    SELECT md5('job' || :tag || i)::uuid, 'artifact.acquire.v1', md5(:tag || i)::uuid,
        'succeeded', '{}'::jsonb, 1, now(), now(), now()
    FROM generate_series(1, :nodes) AS i WHERE i % 50 = 5
    """,
    """
    INSERT INTO node_artifacts (node_id, root, repository, "commit", files, job_id,
                                recorded_at)
    SELECT md5(:tag || i)::uuid, '/models', :repo, :commit, jsonb_build_array(
        jsonb_build_object('path', CAST(:path AS text), 'size', 1, 'digest',
            jsonb_build_object('algorithm', 'sha256', 'value', CAST(:digest AS text)))),
        md5('job' || :tag || i)::uuid, now()
    FROM generate_series(1, :nodes) AS i WHERE i % 50 = 5
    """,
]


def _template(need: int) -> dict[str, Any]:
    return sized_template(need, uuid.uuid4()).model_dump(mode="json")


def _service(
    name: str, need: int, replicas: int, selector: dict[str, str], kind: str | None
) -> Service:
    now = datetime.now(UTC)
    return Service(
        id=uuid.uuid4(),
        name=name,
        roles=[],
        state="active",
        template=_template(need),
        generation=1,
        replicas=replicas,
        placement={"selector": selector, "device_kind": kind, "max_per_node": 1},
        strategy={},
        rollout_state="complete",
        backoff={},
        created_at=now,
        updated_at=now,
    )


def _replica(service: Service, node_id: uuid.UUID, device_id: str, receipt: Any) -> ServiceReplica:
    now = datetime.now(UTC)
    return ServiceReplica(
        id=uuid.uuid4(),
        service_id=service.id,
        generation=service.generation,
        node_id=node_id,
        device_id=device_id,
        phase="acquiring",
        receipt=receipt,
        created_at=now,
        updated_at=now,
        phase_changed_at=now,
    )


async def seed(sessions: async_sessionmaker[AsyncSession], nodes: int, tag: str) -> None:
    """The fleet, and a background service whose replicas hold a device on 10 % of
    the GPU nodes (those devices count as busy)."""
    values = {
        "tag": tag,
        "nodes": nodes,
        "env": ENV,
        "repo": REPO,
        "commit": COMMIT,
        "path": PATH,
        "digest": DIGEST,
    }
    background = _service(f"bench-background-{tag}", 1 * GiB, 0, {}, None)
    async with sessions() as session, session.begin():
        for statement in _SEED:
            await session.execute(text(statement), values)
        session.add(background)
        await session.flush()
        await session.execute(
            text(
                """
                INSERT INTO service_replicas (id, service_id, generation, node_id, device_id,
                    phase, created_at, updated_at, phase_changed_at)
                SELECT gen_random_uuid(), :service, 1, md5(:tag || i)::uuid, 'gpu:0',
                    'ready', now(), now(), now()
                FROM generate_series(1, :nodes) AS i WHERE i % 10 = 7 AND i % 4 <> 0
                """
            ),
            {"service": background.id, "tag": tag, "nodes": nodes},
        )
    # Fresh statistics, as autovacuum would have them on a fleet this size (in its own
    # transaction, committed: statistics are transactional).
    async with sessions() as session, session.begin():
        await session.execute(text("ANALYZE"))


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _decisions(
    sessions: async_sessionmaker[AsyncSession], cache: FleetCache, service: Service, count: int
) -> tuple[list[float], Any]:
    times: list[float] = []
    receipt = None
    for _ in range(count):
        started = time.perf_counter()
        async with sessions() as session, session.begin():
            receipt = await decide(session, service, datetime.now(UTC), cache)
        times.append((time.perf_counter() - started) * 1000)
    return times, receipt


async def _sustained(
    sessions: async_sessionmaker[AsyncSession], cache: FleetCache, service: Service, seconds: float
) -> list[float]:
    """Decisions back to back for longer than a snapshot's age: the ones that take a new
    snapshot are among them."""
    times: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        more, _ = await _decisions(sessions, cache, service, 20)
        times += more
    return times


async def _refreshes(
    sessions: async_sessionmaker[AsyncSession], cache: FleetCache, count: int
) -> list[float]:
    """A snapshot taken again (nothing changed: the listing, no report parsed again)."""
    times = []
    for _ in range(count):
        async with sessions() as session:
            started = time.perf_counter()
            await cache.snapshot(session, force=True)
            times.append((time.perf_counter() - started) * 1000)
    return times


async def _place_all(
    sessions: async_sessionmaker[AsyncSession], cache: FleetCache, service: Service
) -> tuple[float, int]:
    """decide + insert the replica + commit, as the reconciler does, until placed."""
    placed = 0
    started = time.perf_counter()
    for _ in range(service.replicas):
        async with sessions() as session, session.begin():
            receipt = await decide(session, service, datetime.now(UTC), cache)
            if receipt.node_id is None or receipt.device_id is None:
                break
            session.add(
                _replica(
                    service, receipt.node_id, receipt.device_id, receipt.model_dump(mode="json")
                )
            )
            placed += 1
    return time.perf_counter() - started, placed


async def _figures(
    database_url: str, nodes: int, decisions: int, replicas: int, sustain_s: float
) -> dict[str, Any]:
    engine = make_engine(database_url, pool_size=2)
    sessions = make_sessionmaker(engine)
    # The fleet snapshot a worker process keeps from one decision to the next.
    cache = FleetCache()
    tag = uuid.uuid4().hex[:8]
    try:
        started = time.perf_counter()
        await seed(sessions, nodes, tag)
        seeded_s = time.perf_counter() - started
        wide = _service(f"bench-wide-{tag}", 5 * GiB, replicas, {}, "cuda")
        narrow = _service(f"bench-narrow-{tag}", 5 * GiB, 1, {"zone": "z3"}, "cpu")
        async with sessions() as session, session.begin():
            session.add_all([wide, narrow])
        await _decisions(sessions, cache, wide, 5)  # warm the pool and the plan cache
        times, receipt = await _decisions(sessions, cache, wide, decisions)
        sustained = await _sustained(sessions, cache, wide, sustain_s)
        narrow_times, narrow_receipt = await _decisions(
            sessions, cache, narrow, max(20, decisions // 4)
        )
        place_s, placed = await _place_all(sessions, cache, wide)
        refresh = await _refreshes(sessions, cache, max(5, decisions // 20))
    finally:
        await engine.dispose()
    return {
        "nodes": nodes,
        "seed_s": round(seeded_s, 2),
        "decisions": decisions,
        "decide_p50_ms": round(statistics.median(times), 2),
        "decide_p99_ms": round(_pct(times, 0.99), 2),
        "decide_max_ms": round(max(times), 2),
        "receipt": receipt.message if receipt else None,
        "sustained_s": sustain_s,
        "sustained_decisions": len(sustained),
        "sustained_p50_ms": round(statistics.median(sustained), 2),
        "sustained_p99_ms": round(_pct(sustained, 0.99), 2),
        "sustained_max_ms": round(max(sustained), 2),
        "narrow_p50_ms": round(statistics.median(narrow_times), 2),
        "narrow_p99_ms": round(_pct(narrow_times, 0.99), 2),
        "narrow_receipt": narrow_receipt.message if narrow_receipt else None,
        "snapshot_refresh_p50_ms": round(statistics.median(refresh), 2),
        "snapshot_refresh_max_ms": round(max(refresh), 2),
        "replicas": replicas,
        "replicas_placed": placed,
        "replicas_place_s": round(place_s, 2),
    }


def placement_figures(
    database_url: str,
    nodes: int = 10_000,
    decisions: int = 200,
    replicas: int = 100,
    sustain_s: float = 2 * MAX_AGE_S + 2,
) -> dict[str, Any]:
    """The decision's p50/p99 over `nodes` nodes added to this (migrated) database, the
    same sustained for `sustain_s` (snapshots taken again included), and the time to
    place a service of `replicas` replicas."""
    return asyncio.run(_figures(database_url, nodes, decisions, replicas, sustain_s))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--decisions", type=int, default=200)
    parser.add_argument("--replicas", type=int, default=100)
    parser.add_argument("--sustain-s", type=float, default=2 * MAX_AGE_S + 2)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="mf-placement-") as workdir,
        hb.database(Path(workdir), durable=False) as (url, _),
    ):
        figures = placement_figures(url, args.nodes, args.decisions, args.replicas, args.sustain_s)
    print(json.dumps(figures, indent=2))
    print(
        f"placement over {figures['nodes']} nodes: p50 {figures['decide_p50_ms']} ms,"
        f" p99 {figures['decide_p99_ms']} ms (goal < 50 ms); sustained"
        f" {figures['sustained_s']} s ({figures['sustained_decisions']} decisions, new"
        f" snapshots included): p99 {figures['sustained_p99_ms']} ms;"
        f" {figures['replicas_placed']} of {figures['replicas']} replicas placed in"
        f" {figures['replicas_place_s']} s (goal < 10 s); snapshot refresh p50"
        f" {figures['snapshot_refresh_p50_ms']} ms"
    )
    print(f"load average during the run: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
