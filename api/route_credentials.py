"""The credential a route requires, checked again before any of its validation errors
is told: an unauthenticated caller learns nothing of a route's schema.

Each authenticated route checks its credential in a dependency that takes nothing that
can fail validation (api/deps.py), and FastAPI calls dependencies before it reports the
errors of path, query, header and body parameters. That leaves two 422s told before
the credential is known: a body that does not decode (FastAPI reads and parses the body
before it solves dependencies), and the heartbeat's, whose dependency admits a node it
does not cache without the database (its batch decides it, api/agent/heartbeat.py). So the
exception handlers of 422 (api/handlers.py) call `require_route_credential` first: the
route's security scheme, as the OpenAPI document names it, is checked with the same
function its dependency uses, and a refusal (401, or 403 for a disabled node) answers
instead of the 422. It costs nothing on a valid request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from fastapi.security.base import SecurityBase

from api.deps import NODE_BEARER, OPERATOR_KEY, node_outside_transaction, require_operator
from api.gateway.auth import SERVICE_CLIENT_BEARER, client_scope
from api.state import state_of
from schemas.protocol import ADMIN_HEADER

Check = Callable[[Request], Awaitable[None]]


async def _operator(request: Request) -> None:
    await require_operator(request, state_of(request), request.headers.get(ADMIN_HEADER))


async def _node(request: Request) -> None:
    await node_outside_transaction(state_of(request), request.headers.get("Authorization"))


async def _service_client(request: Request) -> None:
    await client_scope(state_of(request), request.headers.get("Authorization"))


_CHECKS: dict[str, Check] = {
    OPERATOR_KEY.scheme_name: _operator,
    NODE_BEARER.scheme_name: _node,
    SERVICE_CLIENT_BEARER.scheme_name: _service_client,
}


def _schemes(dependant: Dependant) -> set[str]:
    found: set[str] = set()
    for sub in dependant.dependencies:
        if isinstance(sub.call, SecurityBase):
            found.add(sub.call.scheme_name)
        found |= _schemes(sub)
    return found


async def require_route_credential(request: Request) -> None:
    """Raise the refusal of the matched route's credential, if the caller does not hold
    it; nothing for a route that takes none (enrollment, health) or an unmatched path."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    for scheme in sorted(_schemes(route.dependant)):
        check = _CHECKS.get(scheme)
        if check is not None:
            await check(request)
