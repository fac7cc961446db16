"""Service-client authentication for the gateway; their secrets are issued, and checked,
by the store's rules (store/deployments/service_clients.py).

A gateway call carries `Authorization: Bearer mfs.<client id>.<secret>`. Anything else
is refused before the database is read: no header (credential_missing), or a value that
is not a service client's, such as a node credential (`mfn…`) or the operator key
(credential_malformed). The rest is one short transaction that only reads: the client by
primary key, the digest compared in constant time, a revoked client refused
(credential_revoked).

An admitted client is remembered by this process (api/gateway/cache.py), kept true by
LISTEN: a revocation (or a rotation) is seen by every API process within milliseconds of
its commit, well inside the one second issue 16 asks for, and at once by the process
that made it.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Security
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from api.deps import BearerHeader, State
from api.errors import Unauthenticated
from api.gateway.scope import ClientScope, scope_of
from api.state import ApiState
from schemas.errors import ErrorCode
from schemas.protocol import HTTP_WHITESPACE, SERVICE_CLIENT_PREFIX
from store import secrets
from store.deployments import service_clients

# The gateway's scheme in the OpenAPI document (Authorize in /docs): the header as sent,
# refused here, never by the scheme (api/deps.py: BearerHeader).
SERVICE_CLIENT_BEARER = BearerHeader(
    "serviceClientBearer",
    f"A service client's secret ({SERVICE_CLIENT_PREFIX}.<client id>.<secret>, shown once "
    "when an operator creates or rotates the client); the gateway routes.",
)


def presented_secret(authorization: str | None) -> secrets.PresentedSecret:
    if not authorization:
        raise Unauthenticated(
            "a service client credential is required", code=ErrorCode.CREDENTIAL_MISSING
        )
    scheme, _, value = authorization.partition(" ")
    # Only what HTTP strips (api/agent/auth.py: bearer_value).
    presented = (
        secrets.parse(SERVICE_CLIENT_PREFIX, value.strip(HTTP_WHITESPACE))
        if scheme.lower() == "bearer"
        else None
    )
    if presented is None:
        raise Unauthenticated(
            "not a service client credential", code=ErrorCode.CREDENTIAL_MALFORMED
        )
    return presented


async def authenticate_client(
    sessions: async_sessionmaker[AsyncSession], presented: secrets.PresentedSecret
) -> tuple[ClientScope, bytes]:
    """The caller's scope and its secret's digest, from one short transaction of its
    own that only reads; a refusal is the store's (store/errors.py: Unauthenticated)."""
    async with sessions() as session, session.begin():
        client = await service_clients.authenticate(
            session, presented.id, secrets.digest(presented.secret)
        )
        return scope_of(client), client.digest


async def client_scope(state: ApiState, authorization: str | None) -> ClientScope:
    """The caller's scope: from this process's cache when it admitted the same secret
    before, else from the database (then remembered)."""
    cache = state.gateway_cache
    presented = presented_secret(authorization)
    cached = cache.client(presented)
    if cached is not None:
        return cached
    generation = cache.generation
    scope, digest = await authenticate_client(state.sessions, presented)
    cache.remember_client(digest, scope, generation)
    return scope


async def _client_scope(
    state: State, authorization: Annotated[str | None, Security(SERVICE_CLIENT_BEARER)]
) -> ClientScope:
    return await client_scope(state, authorization)


ServiceClientAuth = Annotated[ClientScope, Depends(_client_scope)]
