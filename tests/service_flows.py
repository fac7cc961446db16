"""Service steps shared by tests: nodes ready to hold a replica (enrolled, online, a
runtime worker reporting a device and an environment, the artifact in the inventory or
not), a service declared in PostgreSQL, the node's side of a replica's jobs over the
real protocol (the test speaks for the agent and the runtime worker), and one pass of
the workers' sweeps (liveness, deployments, services) as they run them."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx
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
from store.services import rules
from store.services.reconcile import ServicePolicy
from store.services.tables import Service, ServiceReplica
from tests.api_server import RunningApi
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
from tests.runtime_flows import ARTIFACT_SHA256, GGUF, acquire, report_runtime
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


async def scale(
    sessions: async_sessionmaker[AsyncSession], service_id: uuid.UUID, replicas: int
) -> None:
    async with sessions() as session, session.begin():
        await rules.scale(session, service_id, replicas, actor=ACTOR)


async def delete(sessions: async_sessionmaker[AsyncSession], service_id: uuid.UUID) -> None:
    async with sessions() as session, session.begin():
        await rules.delete(session, service_id, actor=ACTOR)


async def roll_out(
    sessions: async_sessionmaker[AsyncSession], service_id: uuid.UUID, new: ServiceTemplate
) -> None:
    """A new template through the rules: the generation moves, the rollout progresses."""
    async with sessions() as session, session.begin():
        await rules.rollout(session, service_id, new, actor=ACTOR)


async def undo(sessions: async_sessionmaker[AsyncSession], service_id: uuid.UUID) -> None:
    async with sessions() as session, session.begin():
        await rules.undo(session, service_id, actor=ACTOR)


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


async def step(
    sessions: async_sessionmaker[AsyncSession], policy: ServicePolicy = POLICY
) -> dict[str, list[str]]:
    """One pass of the deployment reconciler, then the service reconciler."""
    await reconcile_deployments(sessions, RECONCILE_POLICY)
    return await reconcile_services(sessions, policy)


async def liveness(sessions: async_sessionmaker[AsyncSession]) -> None:
    """One liveness sweep on the tests' short thresholds (no partition breaker)."""
    await sweep(sessions, THRESHOLDS, breaker=NO_BREAKER)
