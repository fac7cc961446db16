"""Request dependencies: transactions, node authentication and the operator key.

Transactions are ``scope="function"`` dependencies so they commit *before* the
response is sent: a client never sees success for a change that did not commit.
Authentication is a dependency so it runs before the body is validated: an
unauthenticated caller gets 401, not a description of our schema.

The headers are read through FastAPI security schemes (`OPERATOR_KEY`, `NODE_BEARER`,
and the gateway's `SERVICE_CLIENT_BEARER`, api/gateway/auth.py), so that every operation
that authenticates names its scheme in the OpenAPI document and /docs can Authorize.
They never refuse by themselves (`auto_error` off, the raw header handed on): the
refusals and their codes stay ours, below and in api/agent/auth.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.openapi.models import HTTPBearer as HTTPBearerModel
from fastapi.security import APIKeyHeader
from fastapi.security.base import SecurityBase
from sqlalchemy.ext.asyncio import AsyncSession

from api.agent.auth import (
    admit_cached,
    authenticate_node,
    presented_credential,
    require_credential,
)
from api.errors import Forbidden, Unauthenticated
from api.node_cache import CachedNode
from api.state import ApiState, get_state
from api.ui.session import admitted_by_session
from schemas.errors import ErrorCode
from schemas.protocol import ADMIN_HEADER, NODE_CREDENTIAL_PREFIX
from store import nodes, secrets
from store.deployments import service_clients
from store.node_credentials import AuthenticatedNode

State = Annotated[ApiState, Depends(get_state)]


class BearerHeader(SecurityBase):
    """An `Authorization: Bearer` scheme in the OpenAPI document that hands the header on
    exactly as sent. FastAPI's HTTPBearer answers None for both a missing and a
    malformed header; our refusals tell those apart (credential_missing,
    credential_malformed), so the parsing stays with the callers."""

    def __init__(self, scheme_name: str, description: str) -> None:
        self.model = HTTPBearerModel(description=description)
        self.scheme_name = scheme_name

    async def __call__(self, request: Request) -> str | None:
        return request.headers.get("Authorization")


OPERATOR_KEY = APIKeyHeader(
    name=ADMIN_HEADER,
    scheme_name="operatorKey",
    description="The operator key (MODELFORGE_OPERATOR_API_KEY); every admin route.",
    auto_error=False,
)
NODE_BEARER = BearerHeader(
    "nodeBearer",
    f"A node credential ({NODE_CREDENTIAL_PREFIX}.<id>.<secret>, issued at enrollment); "
    "the agent routes.",
)
# The Authorization header of a node's request, as sent (None when absent).
NodeAuthorization = Annotated[str | None, Security(NODE_BEARER)]


@contextlib.asynccontextmanager
async def _committed(state: ApiState) -> AsyncIterator[AsyncSession]:
    async with state.sessions() as session:
        async with session.begin():
            yield session
        # Committed: a node whose standing it changed is dropped from this process's node
        # cache now, before the response is sent, not when our own NOTIFY comes back; a
        # cache read that began before the commit is then never stored (api/node_cache.py).
        for node_id in nodes.changed_standing(session):
            state.node_cache.forget_node(node_id)
        for client_id in service_clients.changed(session):
            state.gateway_cache.forget_client(client_id)


async def _transaction(state: State) -> AsyncIterator[AsyncSession]:
    async with _committed(state) as session:
        yield session


@dataclass(frozen=True)
class NodeRequest:
    session: AsyncSession
    node: AuthenticatedNode
    state: ApiState


def cached_node(state: ApiState, presented: secrets.PresentedSecret | None) -> CachedNode | None:
    """The node cache's entry for a presented node credential, if the cache may answer."""
    if presented is None or not state.settings.heartbeat_cache or not state.heartbeats.ready:
        return None
    return state.node_cache.lookup(presented)


async def node_outside_transaction(state: ApiState, authorization: str | None) -> AuthenticatedNode:
    """The node of a request that holds no transaction (the notification channel):
    from the node cache, or one short transaction of its own."""
    cached = cached_node(state, presented_credential(authorization))
    if cached is not None:
        return admit_cached(cached, state.heartbeats.database_now())
    async with state.sessions() as session, session.begin():
        return await authenticate_node(session, authorization, serialize=False)


async def _held_node(state: State, authorization: NodeAuthorization) -> AuthenticatedNode:
    return await node_outside_transaction(state, authorization)


@contextlib.asynccontextmanager
async def _node_session(
    state: ApiState, authorization: str | None, *, shed_as: str | None = None
) -> AsyncIterator[NodeRequest]:
    # A node in the node cache is admitted without the credential read and the node
    # lock: its stream row lock orders its samples, and a revocation, disable or
    # decommission reaches every replica's cache within milliseconds (the same bound
    # as a routine heartbeat's). Anything else is authenticated under the node lock and,
    # for the ingest routes (shed_as: the route), only while the transactional path is
    # not overloaded (api/shedding.py).
    presented = presented_credential(authorization)
    cached = cached_node(state, presented)
    async with contextlib.AsyncExitStack() as stack:
        if cached is None and shed_as is not None:
            if presented is None:
                require_credential(authorization)  # the typed 401, before any shedding
            stack.enter_context(state.shedder.admitted(shed_as))
        session = await stack.enter_async_context(state.sessions())
        await stack.enter_async_context(session.begin())
        if cached is not None:
            node = admit_cached(cached, state.heartbeats.database_now())
        else:
            node = await authenticate_node(session, authorization)
        yield NodeRequest(session=session, node=node, state=state)


async def _node_transaction(
    state: State, authorization: NodeAuthorization
) -> AsyncIterator[NodeRequest]:
    async with _node_session(state, authorization) as request:
        yield request


async def _ingest_transaction(
    state: State, authorization: NodeAuthorization, request: Request
) -> AsyncIterator[NodeRequest]:
    # The ingest routes have no path parameters: the path is the route (a metric label).
    async with _node_session(state, authorization, shed_as=request.url.path) as node_request:
        yield node_request


async def require_operator(
    request: Request,
    state: State,
    x_modelforge_admin_token: Annotated[str | None, Security(OPERATOR_KEY)],
) -> None:
    key = state.settings.operator_api_key
    if key is None or not key.get_secret_value():
        raise Forbidden(
            "the admin API is disabled: MODELFORGE_OPERATOR_API_KEY is not set",
            code=ErrorCode.ADMIN_API_DISABLED,
        )
    if not x_modelforge_admin_token:
        # The dashboard's browser holds a session cookie instead (api/ui/session.py).
        if admitted_by_session(request):
            return
        raise Unauthenticated(
            "X-ModelForge-Admin-Token is required", code=ErrorCode.ADMIN_TOKEN_MISSING
        )
    if not secrets.same_secret(x_modelforge_admin_token, key.get_secret_value()):
        raise Unauthenticated("invalid operator key", code=ErrorCode.ADMIN_TOKEN_INVALID)


async def _admin_transaction(
    state: State, _: Annotated[None, Depends(require_operator)]
) -> AsyncIterator[AsyncSession]:
    async with _committed(state) as session:
        yield session


Transaction = Annotated[AsyncSession, Depends(_transaction, scope="function")]
NodeTransaction = Annotated[NodeRequest, Depends(_node_transaction, scope="function")]
# Inventory and telemetry: a node transaction that is shed when overloaded.
IngestTransaction = Annotated[NodeRequest, Depends(_ingest_transaction, scope="function")]
AdminTransaction = Annotated[AsyncSession, Depends(_admin_transaction, scope="function")]
# The node of a request that holds no transaction (an invoke's answer stream), admitted
# as a dependency: before the route's headers, path and body are validated.
HeldNode = Annotated[AuthenticatedNode, Depends(_held_node)]
