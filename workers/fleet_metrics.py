"""Fleet state as Prometheus gauges, read from PostgreSQL by every worker process.

The request and pipeline metrics count what one process did; alerting also needs what
the fleet *is*: nodes stale or offline, a partition hold, the outbox backlog, jobs
retrying after a stall or a lost lease, deployments unavailable. PostgreSQL is the
source of truth for all of that, so each worker process reads it every `PERIOD_S` on
its actors' loop (a handful of aggregate queries on indexed columns) and serves the
result beside its other metrics (workers/main.py).

Every worker process exports the same values (they read the same database): aggregate
them with max(), not sum() (ops/alerts/modelforge.rules.yml does). A refresh that fails
(PostgreSQL away) keeps the last values and counts the failure;
`modelforge_fleet_metrics_refreshed_timestamp_seconds` then stops moving, which is what
an alert on stale gauges looks at.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from datetime import timedelta

from prometheus_client import CollectorRegistry, Counter, Gauge
from sqlalchemy import Executable, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from broker.jetstream import AsyncResource
from schemas.admin import Liveness
from schemas.deployments import ENDED_STATES, DeploymentState
from schemas.jobs import JobKind, JobState
from store import published
from store.deployments.tables import Deployment
from store.fleet import partition_hold_active
from store.models import Job, Node
from workers.database import Database
from workers.services import LoopService

logger = logging.getLogger("modelforge.workers.fleet_metrics")

PERIOD_S = 15.0
# The backlog is counted up to this many rows, so a huge backlog costs a bounded scan.
OUTBOX_COUNT_CAP = 100_000
# A job that ended failed stays in the failure gauge this long, so an alert sees it.
FAILED_WINDOW_S = 3600.0

# What a sweep or a heartbeat records on an enabled node (disabled and decommissioned
# are views, never recorded).
LIVENESS = (Liveness.ONLINE.value, Liveness.STALE.value, Liveness.OFFLINE.value)
OPEN_JOB_STATES = (JobState.QUEUED.value, JobState.LEASED.value)
# Kinds with rows in the jobs table (an invoke is never one).
JOB_KINDS = tuple(kind.value for kind in JobKind if kind is not JobKind.DEPLOYMENT_INVOKE)
DEPLOYMENT_STATES = tuple(s.value for s in DeploymentState if s not in ENDED_STATES)

Labels = tuple[str, ...]


class _Published:
    """One gauge's label sets: a label set that disappeared from the database reads 0
    rather than its last value (and the fixed vocabulary is always there, at 0, so an
    alert sees 0 instead of no series)."""

    def __init__(self, gauge: Gauge, fixed: Iterable[Labels] = ()) -> None:
        self.gauge = gauge
        self.seen: set[Labels] = set(fixed)
        for labels in self.seen:
            gauge.labels(*labels).set(0)

    def publish(self, values: dict[Labels, float]) -> None:
        self.seen |= values.keys()
        for labels in self.seen:
            self.gauge.labels(*labels).set(values.get(labels, 0))


class FleetGauges:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.nodes = _Published(
            Gauge(
                "modelforge_fleet_nodes",
                "Enabled, not decommissioned nodes by recorded liveness (PostgreSQL)",
                ["liveness"],
                registry=registry,
            ),
            [(state,) for state in LIVENESS],
        )
        self.partition_hold = Gauge(
            "modelforge_fleet_partition_hold",
            "1 while an unacknowledged suspected partition holds offline transitions and"
            " lease expiry (store/fleet.py: partition_hold_active)",
            registry=registry,
        )
        self.outbox_unsent = Gauge(
            "modelforge_outbox_unsent",
            f"Outbox events not yet published to JetStream (counted up to {OUTBOX_COUNT_CAP})",
            registry=registry,
        )
        self.outbox_oldest = Gauge(
            "modelforge_outbox_oldest_unsent_seconds",
            "Age of the oldest outbox event not yet published (0 when none)",
            registry=registry,
        )
        self.jobs = _Published(
            Gauge(
                "modelforge_jobs",
                "Jobs waiting to be claimed or under a lease, by kind and state",
                ["kind", "state"],
                registry=registry,
            ),
            [(kind, state) for kind in JOB_KINDS for state in OPEN_JOB_STATES],
        )
        self.job_failures = _Published(
            Gauge(
                "modelforge_job_failures",
                "Jobs whose last attempt failed, by kind and failure code: retrying (queued"
                f" or leased again) or failed for good within the last {FAILED_WINDOW_S:.0f} s",
                ["kind", "failure_code", "state"],
                registry=registry,
            )
        )
        self.deployments = _Published(
            Gauge(
                "modelforge_deployments",
                "Deployments that have not ended, by state",
                ["state"],
                registry=registry,
            ),
            [(state,) for state in DEPLOYMENT_STATES],
        )
        self.refreshed = Gauge(
            "modelforge_fleet_metrics_refreshed_timestamp_seconds",
            "When these fleet gauges were last read from PostgreSQL (Unix time)",
            registry=registry,
        )
        self.refresh_failures = Counter(
            "modelforge_fleet_metrics_refresh_failures",
            "Refreshes of the fleet gauges that failed (the last values stay)",
            registry=registry,
        )

    async def refresh(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        """Read everything in one read-only transaction, then publish it all."""
        async with sessions() as session, session.begin():
            nodes = await _counts(
                session,
                select(Node.liveness, func.count())
                .where(Node.enabled.is_(True), Node.decommissioned_at.is_(None))
                .group_by(Node.liveness),
            )
            hold = await partition_hold_active(session)
            unsent = await published.unsent(session, cap=OUTBOX_COUNT_CAP)
            jobs = await _counts(
                session,
                select(Job.kind, Job.state, func.count())
                .where(Job.state.in_(OPEN_JOB_STATES))
                .group_by(Job.kind, Job.state),
            )
            failed_since = func.statement_timestamp() - timedelta(seconds=FAILED_WINDOW_S)
            failures = await _counts(
                session,
                select(Job.kind, Job.failure_code, Job.state, func.count())
                .where(
                    Job.failure_code.is_not(None),
                    Job.state.in_(OPEN_JOB_STATES)
                    | ((Job.state == JobState.FAILED.value) & (Job.finished_at > failed_since)),
                )
                .group_by(Job.kind, Job.failure_code, Job.state),
            )
            deployments = await _counts(
                session,
                select(Deployment.state, func.count())
                .where(Deployment.state.in_(DEPLOYMENT_STATES))
                .group_by(Deployment.state),
            )
        self.nodes.publish(nodes)
        self.partition_hold.set(1 if hold else 0)
        self.outbox_unsent.set(unsent.count)
        self.outbox_oldest.set(max(0.0, unsent.oldest_s or 0.0))
        self.jobs.publish(jobs)
        self.job_failures.publish(failures)
        self.deployments.publish(deployments)
        self.refreshed.set(time.time())


async def _counts(session: AsyncSession, query: Executable) -> dict[Labels, float]:
    rows = (await session.execute(query)).all()
    return {tuple(str(v) for v in row[:-1]): float(row[-1]) for row in rows}


class FleetMetricsMiddleware(LoopService):
    """Refreshes the gauges every `period_s` on the actors' loop, from worker boot to
    shutdown. Must come after AsyncResourceMiddleware (it uses the shared database)."""

    description = "the fleet gauges"
    stop_timeout_s = 10.0
    log = logger

    def __init__(
        self, database: AsyncResource[Database], gauges: FleetGauges, period_s: float = PERIOD_S
    ) -> None:
        super().__init__()
        self._database = database
        self._gauges = gauges
        self._period_s = period_s

    async def serve(self, stop: asyncio.Event) -> None:
        sessions = self._database.get().sessions
        while not stop.is_set():
            try:
                await self._gauges.refresh(sessions)
            except Exception as exc:  # PostgreSQL away: keep the last values
                self._gauges.refresh_failures.inc()
                logger.warning("fleet gauges not refreshed: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._period_s)
