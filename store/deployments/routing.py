"""What the gateway reads to route (api/gateway/routing.py orders it, api/gateway/cache.py
keeps it per process): the ready deployments on online nodes with their best probe
evidence, and which models and roles are served at all."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Float, func, or_, select, true
from sqlalchemy.ext.asyncio import AsyncSession

from schemas.deployments import DeploymentState
from schemas.endpoints import DEFAULT_ENDPOINTS, Endpoint
from schemas.services import ServiceState
from store.deployments.rules import ENDED
from store.deployments.tables import Deployment
from store.models import Node
from store.runtime_tables import RuntimeEvidence
from store.services.tables import Service


@dataclass(frozen=True)
class Route:
    """A ready deployment a request may go to, with what the choice weighs."""

    deployment_id: uuid.UUID
    node_id: uuid.UUID
    device_id: str
    model: str
    roles: tuple[str, ...]
    queue_depth: int
    max_concurrent: int
    cooling: bool
    # Seconds of cooldown left when read (0: none), for a reader that keeps the route.
    cooldown_left_s: float
    # The best probe evidence of what it serves (None: never probed).
    time_to_first_token_s: float | None
    generation_tokens_per_s: float | None
    # What it serves (chat, completions, embeddings), and whether its chat template can
    # call tools (as its node reported at the load).
    endpoints: tuple[str, ...] = DEFAULT_ENDPOINTS
    tools: bool = False


def _serving(name: str) -> Any:
    return or_(Deployment.model == name, Deployment.roles.contains(func.to_jsonb(name)))


def _deployment_serves(endpoint: Endpoint | None) -> Any:
    return true() if endpoint is None else Deployment.endpoints.contains(func.to_jsonb(endpoint))


async def routes(
    session: AsyncSession, name: str | None = None, endpoint: Endpoint | None = "chat"
) -> list[Route]:
    """Every ready deployment on an online node, with its evidence; of one model or role
    when `name` is given; serving `endpoint` (None: whatever it serves, the whole table
    the gateway's cache keeps)."""
    ttft = RuntimeEvidence.evidence["time_to_first_token_s"].astext.cast(Float)
    tps = RuntimeEvidence.evidence["generation_tokens_per_s"].astext.cast(Float)
    rows = await session.execute(
        select(
            Deployment,
            func.greatest(
                func.extract("epoch", Deployment.cooldown_until - func.statement_timestamp()), 0
            ).label("cooldown_left_s"),
            func.min(ttft).label("ttft"),
            func.max(tps).label("tps"),
        )
        .join(Node, Node.id == Deployment.node_id)
        .outerjoin(
            RuntimeEvidence,
            (RuntimeEvidence.node_id == Deployment.node_id)
            & (RuntimeEvidence.device_id == Deployment.device_id)
            & (RuntimeEvidence.profile_id == Deployment.profile_id)
            & (RuntimeEvidence.environment_id == Deployment.environment_id)
            & (RuntimeEvidence.artifact_digest == Deployment.spec["artifact_digest"].astext),
        )
        .where(
            Deployment.state == DeploymentState.READY.value,
            _serving(name) if name is not None else true(),
            _deployment_serves(endpoint),
            Node.liveness == "online",
            Node.enabled.is_(True),
        )
        .group_by(Deployment.id)
    )
    found = []
    for deployment, cooldown_left_s, best_ttft, best_tps in rows.all():
        left = float(cooldown_left_s or 0.0)
        found.append(
            Route(
                deployment_id=deployment.id,
                node_id=deployment.node_id,
                device_id=deployment.device_id,
                model=deployment.model,
                roles=tuple(deployment.roles),
                endpoints=tuple(deployment.endpoints),
                tools=bool((deployment.capabilities or {}).get("supports_tool_calls")),
                queue_depth=deployment.queue_depth or 0,
                max_concurrent=deployment.max_concurrent,
                cooling=left > 0,
                cooldown_left_s=left,
                time_to_first_token_s=best_ttft,
                generation_tokens_per_s=best_tps,
            )
        )
    return found


def _live_service() -> Any:
    return Service.state != ServiceState.DELETED.value


async def served(session: AsyncSession) -> list[tuple[str, list[str], list[str]]]:
    """(model, roles, endpoints) of every deployment that has not ended and every live
    service (one may have no replica at a given moment, while it heals or scales from
    zero)."""
    rows = await session.execute(
        select(Deployment.model, Deployment.roles, Deployment.endpoints)
        .where(Deployment.state.not_in(list(ENDED)))
        .union_all(select(Service.name, Service.roles, Service.endpoints).where(_live_service()))
    )
    return [(model, list(roles), list(endpoints)) for model, roles, endpoints in rows.all()]


async def anyone_serves(session: AsyncSession, name: str, endpoint: Endpoint = "chat") -> bool:
    """Whether a deployment that has not ended, or a live service, serves this model or
    role at this endpoint: a 404 otherwise. A live service without a ready replica is a
    503 with Retry-After instead, which clients retry (the openai client does by
    default)."""
    row = await session.execute(
        select(Deployment.id)
        .where(Deployment.state.not_in(list(ENDED)), _serving(name), _deployment_serves(endpoint))
        .limit(1)
    )
    if row.first() is not None:
        return True
    service = await session.execute(
        select(Service.id)
        .where(
            _live_service(),
            or_(Service.name == name, Service.roles.contains(func.to_jsonb(name))),
            Service.endpoints.contains(func.to_jsonb(endpoint)),
        )
        .limit(1)
    )
    return service.first() is not None
