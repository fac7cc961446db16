"""Service steps shared by tests: nodes ready to hold a replica (enrolled, online, a
runtime worker reporting a device and an environment, the artifact in the inventory or
not), a service declared in PostgreSQL, the node's side of a replica's jobs over the
real protocol (the test speaks for the agent and the runtime worker), and one pass of
the workers' sweeps (liveness, deployments, services) as they run them."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from schemas.services import (
    Autoscale,
    Placement,
    ResolvedArtifact,
    ServiceArtifact,
    ServiceCreate,
    ServiceTemplate,
    UpdateStrategy,
)
from store.liveness_sweep import sweep
from store.models import OutboxEvent
from store.services import rules
from store.services.reconcile import ServicePolicy
from store.services.snapshot import FleetCache
from store.services.tables import Service, ServiceReplica
from tests.api_server import ApiFactory, RunningApi
from tests.artifact_flows import (
    COMMIT,
    FILES,
    REPOSITORY,
    claimed,
    complete,
    fence,
    node_with_roots,
)
from tests.artifact_flows import fail as fail_artifact_job
from tests.deployment_flows import (
    RECONCILE_POLICY,
    beat,
    claim_deployment_job,
    complete_load,
    complete_target,
    fail_deployment_job,
)
from tests.flows import NO_BREAKER, THRESHOLDS, EnrolledNode
from tests.runtime_flows import ARTIFACT_SHA256, GGUF, acquire, create_profile, report_runtime
from workers.deployments import reconcile as reconcile_deployments
from workers.service_reconcile import reconcile as reconcile_services

ACTOR = "operator"
# The reconciler as the tests run it: a short heal grace, quick backoff.
POLICY = ServicePolicy(heal_grace_s=1.0, max_placements_per_step=8, backoff_base_s=30.0)

ARTIFACT = ResolvedArtifact(
    repository=REPOSITORY,
    revision="main",
    commit=COMMIT,
    path=GGUF,
    size_bytes=len(FILES[GGUF]),
    sha256=ARTIFACT_SHA256,
)


@dataclass
class ServiceNode:
    """A node as its agent and runtime worker: reports, claims and completes."""

    node: EnrolledNode
    hostname: str
    sequence: int = 1
    # Deployments its runtime worker reports loaded, with their invokes in flight.
    loaded: dict[str, int] = field(default_factory=dict)

    @property
    def node_id(self) -> uuid.UUID:
        return uuid.UUID(self.node.node_id)

    def beat(self, client: httpx.Client) -> None:
        beat(client, self.node)

    def report(self, client: httpx.Client) -> None:
        """The runtime worker's report: its device, its binary, what it has loaded."""
        self.sequence += 1
        listed = [
            {"deployment_id": deployment_id, "device_id": "cpu", "model": "smol",
             "state": "ready", "in_flight": in_flight}
            for deployment_id, in_flight in self.loaded.items()
        ]  # fmt: skip
        response = report_runtime(client, self.node, self.sequence, deployments=listed)
        assert response.status_code == 200 and response.json()["applied"], response.text

    def load(self, client: httpx.Client) -> str:
        """Claim the queued load and complete it; the runtime worker then reports it
        loaded. The deployment's id."""
        claim = claim_deployment_job(client, self.node)
        assert claim["kind"] == "deployment.load.v1", claim
        answer = complete_load(client, self.node, claim)
        assert answer.status_code == 200, answer.text
        deployment_id = str(claim["spec"]["deployment_id"])
        self.loaded[deployment_id] = 0
        self.report(client)
        return deployment_id

    def fail_load(self, client: httpx.Client) -> None:
        """Claim the queued load and fail it for good."""
        claim = claim_deployment_job(client, self.node)
        assert claim["kind"] == "deployment.load.v1", claim
        answer = fail_deployment_job(client, self.node, claim, "out_of_memory", retryable=False)
        assert answer.status_code == 200, answer.text

    def drain(self, client: httpx.Client) -> str:
        """Claim the queued drain (or unload) and complete it: the deployment unloaded."""
        claim = claim_deployment_job(client, self.node)
        assert claim["kind"] in ("deployment.drain.v1", "deployment.unload.v1"), claim
        fields: dict[str, Any] = (
            {"finished": 0, "cut": 0, "settle_s": 0.0}
            if claim["kind"] == "deployment.drain.v1"
            else {"unloaded": True}
        )
        answer = complete_target(client, self.node, claim, **fields)
        assert answer.status_code == 200, answer.text
        deployment_id = str(claim["spec"]["deployment_id"])
        self.loaded.pop(deployment_id, None)
        self.report(client)
        return deployment_id

    def acquire(self, client: httpx.Client) -> None:
        """Claim the queued artifact job and complete it with the verified file."""
        job = claimed(client, self.node)
        answer = complete(client, self.node, job["job_id"], fence(job), files=job["spec"]["files"])
        assert answer.status_code == 200 and answer.json()["state"] == "succeeded", answer.text

    def fail_acquire(self, client: httpx.Client) -> None:
        job = claimed(client, self.node)
        answer = fail_artifact_job(
            client, self.node, job["job_id"], fence(job), "checksum_mismatch", retryable=False
        )
        assert answer.status_code == 200, answer.text


def service_node(
    client: httpx.Client, api: RunningApi, hostname: str, *, holds: bool = True
) -> ServiceNode:
    """An enrolled, online node with artifact roots, a runtime worker reporting its cpu
    device and binary, and (holds) the artifact's file verified in its inventory."""
    node = node_with_roots(client, api, hostname=hostname)
    if holds:
        acquire(client, api, node)
    ready = ServiceNode(node, hostname)
    ready.beat(client)
    ready.report(client)
    return ready


def fleet(
    api: RunningApi, count: int, *, holds: bool = True
) -> tuple[list[ServiceNode], dict[str, Any]]:
    """`count` service nodes (host-0, host-1, ...) and a runtime profile to serve on them."""
    with api.client() as client:
        nodes = [service_node(client, api, f"host-{i}", holds=holds) for i in range(count)]
        return nodes, create_profile(client, api)


def another_profile(api: RunningApi, name: str, **settings: Any) -> dict[str, Any]:
    with api.client() as client:
        return create_profile(client, api, name=name, **settings)


def service_api(api_factory: ApiFactory, **settings: Any) -> RunningApi:
    """An API on the tests' short liveness thresholds, so nodes go offline quickly."""
    return api_factory(
        stale_after_s=THRESHOLDS.stale_after_s,
        offline_after_s=THRESHOLDS.offline_after_s,
        **settings,
    )


@pytest.fixture(name="api")
def ready_api(api_factory: ApiFactory) -> RunningApi:
    """The service tests' `api` (a test module imports this as `ready_api as ready_api`):
    short liveness thresholds and a quick job retry."""
    return service_api(api_factory, job_retry_base_s=0.1)


def on(nodes: list[ServiceNode], node_id: uuid.UUID) -> ServiceNode:
    [found] = [node for node in nodes if node.node_id == node_id]
    return found


async def in_thread(api: RunningApi, act: Callable[[httpx.Client], Any]) -> Any:
    """Run a node's protocol step (over a fresh client) off the event loop."""

    def run() -> Any:
        with api.client() as client:
            return act(client)

    return await asyncio.to_thread(run)


async def load_all(api: RunningApi, nodes: list[ServiceNode]) -> None:
    """Each node claims and completes the load the reconciler queued on it."""

    def load(client: httpx.Client) -> None:
        for node in nodes:
            node.load(client)

    await in_thread(api, load)


async def made_ready(
    sessions: async_sessionmaker[AsyncSession],
    api: RunningApi,
    nodes: list[ServiceNode],
    service_id: uuid.UUID,
) -> list[ServiceReplica]:
    """A sweep places the service's replicas, each one's node loads it, and a sweep
    sees them ready. The replicas as placed (phase loading)."""
    await step(sessions)
    placed = await replicas(sessions, service_id)
    await load_all(api, [on(nodes, row.node_id) for row in placed])
    await step(sessions)
    return placed


async def sweep_keeping_alive(
    sessions: async_sessionmaker[AsyncSession], api: RunningApi, alive: list[ServiceNode]
) -> dict[str, list[str]]:
    """The live nodes beat; then the liveness sweep, the deployment and service
    reconcilers run once."""

    def beat_all(client: httpx.Client) -> None:
        for node in alive:
            node.beat(client)

    await in_thread(api, beat_all)
    await liveness(sessions)
    return await step(sessions)


def template(profile_id: str, **changes: Any) -> ServiceTemplate:
    base = ServiceTemplate(
        artifact=ARTIFACT,
        profile_id=uuid.UUID(profile_id),
        profile_version=1,
        environment_id=None,
        max_concurrent=4,
    )
    return base.model_copy(update=changes)


async def create_service(
    sessions: async_sessionmaker[AsyncSession],
    profile_id: str,
    *,
    name: str = "smol",
    replicas: int = 1,
    autoscale: Autoscale | None = None,
    placement: Placement | None = None,
    strategy: UpdateStrategy | None = None,
) -> uuid.UUID:
    """A service declared through the rules (store/services/rules.py: create, as the
    admin route does once it resolved the artifact): active at generation 1, no replica
    yet."""
    request = ServiceCreate(
        name=name,
        roles=["planner"],
        artifact=ServiceArtifact(repository=ARTIFACT.repository, path=ARTIFACT.path),
        profile_id=uuid.UUID(profile_id),
        replicas=replicas,
        autoscale=autoscale,
        placement=placement or Placement(),
        strategy=strategy or UpdateStrategy(),
    )
    async with sessions() as session, session.begin():
        service = await rules.create(session, request, ARTIFACT, None, actor=ACTOR)
    return service.id


async def fleet_serving(
    sessions: async_sessionmaker[AsyncSession],
    api: RunningApi,
    count: int,
    *,
    holds: bool = True,
    **declared: Any,
) -> tuple[list[ServiceNode], dict[str, Any], uuid.UUID]:
    """`count` service nodes and a profile (fleet), and a service declared on that
    profile (create_service, with `declared`): the nodes, the profile, the service."""
    nodes, profile = fleet(api, count, holds=holds)
    return nodes, profile, await create_service(sessions, profile["id"], **declared)


async def apply_rule(
    sessions: async_sessionmaker[AsyncSession],
    rule: Callable[..., Awaitable[Any]],
    service_id: uuid.UUID,
    *args: Any,
) -> None:
    """One of the rules (store/services/rules.py: scale, delete, rollout, undo) on the
    service, in its own transaction, as the operator."""
    async with sessions() as session, session.begin():
        await rule(session, service_id, *args, actor=ACTOR)


async def change(
    sessions: async_sessionmaker[AsyncSession], service_id: uuid.UUID, **values: Any
) -> None:
    """Set columns of the service row directly (what no rule sets: a cooldown's start)."""
    async with sessions() as session, session.begin():
        service = await session.get(Service, service_id, with_for_update=True)
        assert service is not None
        for key, value in values.items():
            setattr(service, key, value)


async def service_row(sessions: async_sessionmaker[AsyncSession], service_id: uuid.UUID) -> Service:
    async with sessions() as session:
        found = await session.get(Service, service_id)
        assert found is not None
        return found


async def replicas(
    sessions: async_sessionmaker[AsyncSession], service_id: uuid.UUID, *, ended: bool = False
) -> list[ServiceReplica]:
    """The service's replicas, oldest first (live ones only unless `ended`)."""
    async with sessions() as session:
        query = select(ServiceReplica).where(ServiceReplica.service_id == service_id)
        if not ended:
            query = query.where(ServiceReplica.phase != "ended")
        rows = await session.execute(query.order_by(ServiceReplica.created_at))
        return list(rows.scalars().all())


def phases(rows: list[ServiceReplica]) -> list[str]:
    return sorted(row.phase for row in rows)


def ready_count(rows: list[ServiceReplica]) -> int:
    return sum(1 for row in rows if row.phase == "ready")


def nodes_of(rows: list[ServiceReplica]) -> set[uuid.UUID]:
    return {row.node_id for row in rows}


async def events(sessions: async_sessionmaker[AsyncSession], action: str) -> list[dict[str, Any]]:
    """The outbox's events of one type (e.g. service.changed), oldest first."""
    async with sessions() as session:
        rows = await session.execute(
            select(OutboxEvent.envelope)
            .where(OutboxEvent.envelope["action"].astext == action)
            .order_by(OutboxEvent.position)
        )
        return [dict(row) for row in rows.scalars()]


async def step(
    sessions: async_sessionmaker[AsyncSession], policy: ServicePolicy = POLICY
) -> dict[str, list[str]]:
    """One pass of the deployment reconciler, then the service reconciler (on a fleet
    snapshot of its own: every pass sees the fleet as it is now)."""
    await reconcile_deployments(sessions, RECONCILE_POLICY)
    return await reconcile_services(sessions, policy, FleetCache())


async def rollout_rounds(
    sessions: async_sessionmaker[AsyncSession], service_id: uuid.UUID, most: int
) -> AsyncIterator[list[ServiceReplica]]:
    """While the service's rollout progresses (at most `most` rounds): a sweep, then the
    live replicas it left, for the caller to check and act on as the nodes."""
    rounds = 0
    while (await service_row(sessions, service_id)).rollout_state == "progressing":
        rounds += 1
        assert rounds <= most, "the rollout did not finish"
        await step(sessions)
        yield await replicas(sessions, service_id)


async def liveness(sessions: async_sessionmaker[AsyncSession]) -> None:
    """One liveness sweep on the tests' short thresholds (no partition breaker)."""
    await sweep(sessions, THRESHOLDS, breaker=NO_BREAKER)
