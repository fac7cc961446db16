"""Operator routes for service clients, the gateway's callers (create, list, get,
rotate, revoke). The secret is issued by the store's rule
(store/deployments/service_clients.py) and shown once, by create and rotate; only its
digest is kept. Included in the admin router (operator check)."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, status

from api.deps import AdminTransaction
from api.errors import error_responses
from schemas.admin import PageLimit
from schemas.events import OPERATOR_ACTOR
from schemas.protocol import SERVICE_CLIENTS
from schemas.service_clients import (
    ServiceClientCreate,
    ServiceClientCreated,
    ServiceClientList,
    ServiceClientState,
    ServiceClientView,
)
from store.deployments import service_clients
from store.deployments.service_client_tables import ServiceClient
from store.deployments.service_clients import IssuedClient

router = APIRouter()


def client_view(client: ServiceClient) -> ServiceClientView:
    return ServiceClientView(
        id=client.id,
        name=client.name,
        models=list(client.models),
        roles=list(client.roles),
        max_concurrent=client.max_concurrent,
        rate_per_minute=client.rate_per_minute,
        max_tokens_per_day=client.max_tokens_per_day,
        state=service_clients.state_of(client),
        created_at=client.created_at,
        rotated_at=client.rotated_at,
        revoked_at=client.revoked_at,
    )


def created_view(issued: IssuedClient) -> ServiceClientCreated:
    return ServiceClientCreated(**client_view(issued.client).model_dump(), secret=issued.secret)


@router.post(SERVICE_CLIENTS, status_code=status.HTTP_201_CREATED)
async def create_service_client(
    body: ServiceClientCreate, session: AdminTransaction
) -> ServiceClientCreated:
    """The secret is in this answer only; it is never shown again."""
    issued = await service_clients.create(session, body, actor=OPERATOR_ACTOR)
    return created_view(issued)


@router.get(SERVICE_CLIENTS)
async def list_service_clients(
    session: AdminTransaction,
    state: ServiceClientState | None = None,
    limit: PageLimit = 100,
) -> ServiceClientList:
    """Newest first."""
    rows = await service_clients.clients(session, state, limit)
    return ServiceClientList(items=[client_view(c) for c in rows])


@router.get(SERVICE_CLIENTS + "/{client_id}", responses=error_responses(404))
async def get_service_client(client_id: uuid.UUID, session: AdminTransaction) -> ServiceClientView:
    return client_view(await service_clients.get(session, client_id))


@router.post(SERVICE_CLIENTS + "/{client_id}/rotate", responses=error_responses(404, 409))
async def rotate_service_client(
    client_id: uuid.UUID, session: AdminTransaction
) -> ServiceClientCreated:
    """A new secret, shown once; the old one stops working when this answers."""
    issued = await service_clients.rotate(session, client_id, actor=OPERATOR_ACTOR)
    return created_view(issued)


@router.post(SERVICE_CLIENTS + "/{client_id}/revoke", responses=error_responses(404, 409))
async def revoke_service_client(
    client_id: uuid.UUID, session: AdminTransaction
) -> ServiceClientView:
    """Every API process refuses the client from the next call on (api/gateway/auth.py);
    revoking again is refused (409 state_conflict)."""
    return client_view(await service_clients.revoke(session, client_id, actor=OPERATOR_ACTOR))
