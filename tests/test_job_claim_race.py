"""Only one holder: twenty concurrent claims of a node's one job yield exactly one lease,
round after round; and concurrent lease-expiry sweeps take each lease back exactly once.

Real HTTP against a real API and PostgreSQL for the claims; the expiry sweeps are the
workers' own code (workers/leases.py) on the same database.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from schemas.protocol import ARTIFACT_JOB_FAIL, ARTIFACT_JOBS_NEXT
from store.engine import make_engine, make_sessionmaker
from store.leases import LeasePolicy
from tests.api_server import ApiFactory
from tests.artifact_flows import claimed, created, fence, node_with_roots, progress
from tests.flows import released_together
from tests.services import db_fetch
from workers.leases import expire

CLAIMS = 20
ROUNDS = 5


async def test_twenty_concurrent_claims_one_winner(
    api_factory: ApiFactory, database_url: str
) -> None:
    api = api_factory()
    with api.client() as admin:
        node = node_with_roots(admin, api)
        async with api.async_client() as client:
            await asyncio.gather(*(client.get("/healthz") for _ in range(CLAIMS)))
            for round_no in range(ROUNDS):
                job_id = created(admin, api, node)
                responses = await released_together(
                    CLAIMS, lambda _: client.get(ARTIFACT_JOBS_NEXT, headers=node.headers)
                )
                statuses = Counter(r.status_code for r in responses)
                assert statuses == Counter({200: 1, 204: CLAIMS - 1}), (round_no, statuses)
                [winner] = [r.json() for r in responses if r.status_code == 200]
                assert winner["job_id"] == job_id and winner["lease"]["epoch"] == 1
                # Finish it, so the next round's job is the only claimable one.
                done = admin.post(
                    ARTIFACT_JOB_FAIL.format(job_id=job_id),
                    json={"lease": fence(winner), "code": "internal", "retryable": False},
                    headers=node.headers,
                )
                assert done.status_code == 200, done.text
    claims = await db_fetch(
        database_url,
        "SELECT count(*) AS n FROM outbox WHERE envelope->>'action' = 'job.claimed'",
    )
    assert claims[0]["n"] == ROUNDS


async def test_concurrent_expiry_sweeps_take_each_lease_back_once(
    api_factory: ApiFactory, database_url: str
) -> None:
    api = api_factory(job_lease_s=0.3, job_retry_base_s=0.0)
    jobs = 30
    with api.client() as client:
        node = node_with_roots(client, api)
        ids = [created(client, api, node, max_attempts=3) for _ in range(jobs)]
        leases = [claimed(client, node) for _ in range(jobs)]
        assert sorted(lease["job_id"] for lease in leases) == sorted(ids)
    # Every lease past due before the sweepers race: time must pass (the database
    # clock decides), no state to wait for.
    await asyncio.sleep(0.5)
    engine = make_engine(database_url, pool_size=8)
    try:
        sessions = make_sessionmaker(engine)
        policy = LeasePolicy(lease_s=0.3, retry_base_s=0.0)
        counts = await asyncio.gather(*(expire(sessions, policy, batch_size=4) for _ in range(6)))
    finally:
        await engine.dispose()
    assert sum(counts) == jobs
    rows = await db_fetch(
        database_url,
        "SELECT envelope->'data'->>'job_id' AS job, count(*) AS n FROM outbox"
        " WHERE envelope->>'action' = 'job.expired' GROUP BY 1",
    )
    assert {row["job"]: row["n"] for row in rows} == dict.fromkeys(ids, 1)
    states = await db_fetch(database_url, "SELECT state, attempt FROM jobs")
    assert {(row["state"], row["attempt"]) for row in states} == {("queued", 1)}
    # The holders of the expired leases are fenced off.
    with api.client() as client:
        answer = progress(client, node, leases[0]["job_id"], fence(leases[0]), 1)
        assert answer.status_code == 409 and answer.json()["code"] == "lease_stale"
