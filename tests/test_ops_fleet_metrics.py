"""The fleet gauges the alert rules (ops/alerts/) stand on: read from PostgreSQL as it
is, and served by a real `modelforge worker` on its metrics port."""

from __future__ import annotations

import socket
import time
import urllib.request
import uuid
from datetime import UTC, datetime, timedelta

from prometheus_client import CollectorRegistry
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from schemas.jobs import JobKind
from store.fleet import PARTITION
from store.models import FleetIncident, Job, Node, OutboxEvent
from tests.worker_processes import Workers
from workers.fleet_metrics import FleetGauges

ARTIFACT = JobKind.ARTIFACT_ACQUIRE.value


def _node(liveness: str, **extra: object) -> Node:
    return Node(
        id=uuid.uuid4(),
        hostname="gpu",
        protocol_version=1,
        agent_version="0.1.0",
        liveness=liveness,
        **extra,
    )


def _job(node: Node, state: str, failure: str | None = None, **extra: object) -> Job:
    now = datetime.now(UTC)
    return Job(
        id=uuid.uuid4(),
        kind=ARTIFACT,
        node_id=node.id,
        state=state,
        spec={},
        max_attempts=3,
        available_at=now,
        failure_code=failure,
        created_at=now,
        updated_at=now,
        **extra,
    )


async def test_the_gauges_say_what_the_database_holds(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    now = datetime.now(UTC)
    online, stale = _node("online"), _node("stale")
    async with sessions() as session, session.begin():
        session.add_all([online, stale, _node("stale"), _node("offline")])
        # Neither counts: the operator took them out of the fleet.
        session.add_all([_node("stale", enabled=False), _node("offline", decommissioned_at=now)])
        session.add(
            FleetIncident(
                id=uuid.uuid4(), kind=PARTITION, opened_at=now, silent_nodes=7, watched_nodes=10
            )
        )
        for _ in range(3):
            session.add(
                OutboxEvent(
                    id=uuid.uuid4(),
                    subject="modelforge.v1.test",
                    envelope={},
                    created_at=now - timedelta(seconds=60),
                )
            )
        await session.flush()
        session.add_all(
            [
                _job(online, "queued", "stalled"),  # a stalled download, waiting its retry
                _job(online, "leased"),
                _job(stale, "failed", "lease_expired", finished_at=now),
                # Failed for good long ago: no longer an alert's business.
                _job(stale, "failed", "lease_expired", finished_at=now - timedelta(hours=2)),
                _job(online, "succeeded", finished_at=now),
            ]
        )

    registry = CollectorRegistry()
    await FleetGauges(registry).refresh(sessions)

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("modelforge_fleet_nodes", liveness="online") == 1
    assert value("modelforge_fleet_nodes", liveness="stale") == 2
    assert value("modelforge_fleet_nodes", liveness="offline") == 1
    assert value("modelforge_fleet_partition_hold") == 1
    assert value("modelforge_outbox_unsent") == 3
    oldest = value("modelforge_outbox_oldest_unsent_seconds")
    assert oldest is not None and 55 < oldest < 600
    assert value("modelforge_jobs", kind=ARTIFACT, state="queued") == 1
    assert value("modelforge_jobs", kind=ARTIFACT, state="leased") == 1
    assert value("modelforge_job_failures", kind=ARTIFACT, failure_code="stalled", state="queued")
    assert (
        value(
            "modelforge_job_failures", kind=ARTIFACT, failure_code="lease_expired", state="failed"
        )
        == 1
    )
    # The fixed vocabulary is there at 0, so a rule sees 0 rather than no series.
    assert value("modelforge_deployments", state="unavailable") == 0
    assert value("modelforge_jobs", kind=JobKind.DEPLOYMENT_LOAD.value, state="queued") == 0
    refreshed = value("modelforge_fleet_metrics_refreshed_timestamp_seconds")
    assert refreshed is not None and abs(refreshed - time.time()) < 60


async def test_a_label_set_that_disappears_reads_zero(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    node = _node("online")
    async with sessions() as session, session.begin():
        session.add(node)
        await session.flush()
        job = _job(node, "queued", "stalled")
        session.add(job)
    registry = CollectorRegistry()
    gauges = FleetGauges(registry)
    await gauges.refresh(sessions)
    labels = {"kind": ARTIFACT, "failure_code": "stalled", "state": "queued"}
    assert registry.get_sample_value("modelforge_job_failures", labels) == 1
    async with sessions() as session, session.begin():
        (await session.get(Job, job.id)).state = "succeeded"  # type: ignore[union-attr]
    await gauges.refresh(sessions)
    assert registry.get_sample_value("modelforge_job_failures", labels) == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_worker_serves_the_fleet_gauges(workers: Workers) -> None:
    port = _free_port()
    workers.env["MODELFORGE_METRICS_PORT"] = str(port)
    workers.start(1)
    deadline = time.monotonic() + 60
    text = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            text = ""
        if "modelforge_fleet_metrics_refreshed_timestamp_seconds " in text and (
            "modelforge_fleet_metrics_refreshed_timestamp_seconds 0.0" not in text
        ):
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"no refreshed fleet gauges within 60 s:\n{text}\n{workers.logs()}")
    for name in (
        'modelforge_fleet_nodes{liveness="stale"} 0.0',
        "modelforge_fleet_partition_hold 0.0",
        "modelforge_outbox_unsent ",
        'modelforge_deployments{state="unavailable"} 0.0',
    ):
        assert name in text, name
