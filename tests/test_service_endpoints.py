"""A service's endpoints (issue 34): declared on create, kept in its template and its
row (for the gateway's reads), copied onto every replica's deployment; a change of
endpoints is a rollout (a new generation), and one that changes nothing is refused."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from schemas.services import Placement, ServiceArtifact, ServiceCreate, UpdateStrategy
from store.deployments import routing
from store.deployments.tables import Deployment
from store.errors import Conflict
from store.services import rules
from tests.api_server import RunningApi
from tests.service_flows import (
    ACTOR,
    ARTIFACT,
    apply_rule,
    fleet,
    replicas,
    service_row,
    step,
    template,
)

# The fixture `api` these tests run on.
from tests.service_flows import ready_api as ready_api


async def test_a_services_endpoints_reach_its_replicas_and_roll_out(
    api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> None:
    _, profile = fleet(api, 1)
    request = ServiceCreate(
        name="embedder", roles=[],
        artifact=ServiceArtifact(repository=ARTIFACT.repository, path=ARTIFACT.path),
        profile_id=uuid.UUID(profile["id"]), placement=Placement(), strategy=UpdateStrategy(),
        endpoints=["embeddings", "chat"],
    )  # fmt: skip
    async with sessions() as session, session.begin():
        service = await rules.create(session, request, ARTIFACT, None, actor=ACTOR)
    row = await service_row(sessions, service.id)
    assert row.endpoints == ["chat", "embeddings"] == row.template["endpoints"]
    async with sessions() as session:
        assert await routing.anyone_serves(session, "embedder", "embeddings")
        assert not await routing.anyone_serves(session, "embedder", "completions")

    await step(sessions)
    [replica] = await replicas(sessions, service.id)
    assert replica.deployment_id is not None
    async with sessions() as session:
        deployment = await session.get(Deployment, replica.deployment_id)
        assert deployment is not None
        assert deployment.endpoints == ["chat", "embeddings"]
        assert deployment.spec["endpoints"] == ["chat", "embeddings"]

    # Only the endpoints change: a rollout, to a new generation.
    changed = template(profile["id"], endpoints=["embeddings"])
    await apply_rule(sessions, rules.rollout, service.id, changed)
    row = await service_row(sessions, service.id)
    assert row.generation == 2 and row.endpoints == ["embeddings"]
    assert row.template["endpoints"] == ["embeddings"]
    with pytest.raises(Conflict):
        await apply_rule(sessions, rules.rollout, service.id, changed)
