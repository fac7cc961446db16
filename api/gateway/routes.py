"""`GET /v1/models` and `POST /v1/chat/completions` for service clients, and the
gateway's one router: the legacy completions (api/gateway/completions.py) and the
embeddings (api/gateway/embeddings.py) join it here. What happens to a request once
validated is the same at every endpoint (api/gateway/call.py)."""

from __future__ import annotations

from collections.abc import Iterable

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api.deps import State
from api.gateway import completions, embeddings
from api.gateway.auth import ServiceClientAuth
from api.gateway.call import CallSpec
from api.gateway.errors import ERRORS
from api.gateway.params import chat_params, max_tokens
from api.gateway.serve import Arrived, serve
from api.gateway.tally import chat_texts
from schemas.endpoints import ENDPOINT_ORDER, Endpoint
from schemas.gateway import ChatCompletionRequest, ModelEntry, ModelListing
from schemas.protocol import GATEWAY_CHAT_COMPLETIONS, GATEWAY_MODELS
from store.deployments import routing as deployment_routes

router = APIRouter(tags=["gateway"], responses=ERRORS)


def _ordered(endpoints: Iterable[str]) -> list[Endpoint]:
    served = set(endpoints)
    return [endpoint for endpoint in ENDPOINT_ORDER if endpoint in served]


@router.get(GATEWAY_MODELS)
async def list_models(arrived: Arrived, scope: ServiceClientAuth, state: State) -> ModelListing:
    """The served models and roles this client may call that some deployment serves,
    each with the endpoints it is served at."""
    async with state.sessions() as session, session.begin():
        served = await deployment_routes.served(session)
    models: dict[str, tuple[set[str], set[str]]] = {}
    roles: dict[str, set[str]] = {}
    for model, model_roles, endpoints in served:
        if model in scope.models:
            entry = models.setdefault(model, (set(), set()))
            entry[0].update(model_roles)
            entry[1].update(endpoints)
        for role in model_roles:
            if role in scope.roles:
                roles.setdefault(role, set()).update(endpoints)
    data = [
        ModelEntry(id=m, roles=sorted(r), endpoints=_ordered(e))
        for m, (r, e) in sorted(models.items())
    ]
    data += [
        ModelEntry(id=role, kind="role", endpoints=_ordered(e))
        for role, e in sorted(roles.items())
        if role not in models
    ]
    return ModelListing(data=data)


@router.post(GATEWAY_CHAT_COMPLETIONS, response_model=None)
async def chat_completions(
    arrived: Arrived,
    scope: ServiceClientAuth,
    body: ChatCompletionRequest,
    request: Request,
    state: State,
) -> Response:
    """OpenAI's chat completion, plain or streamed (`stream: true`, server-sent events)."""
    default = state.settings.gateway_default_max_tokens

    def spec() -> CallSpec:
        return CallSpec(
            endpoint="chat",
            model=body.model,
            stream=body.stream,
            params=chat_params(body, default),
            texts=chat_texts(body.messages, body.tools),
            max_tokens=max_tokens(body, default),
            strip_usage=not (body.stream_options and body.stream_options.include_usage),
            needs_tools=bool(body.tools) and body.tool_choice != "none",
        )

    return await serve(
        arrived, scope, request, state, body.model, spec, endpoint="chat", stream=body.stream
    )


router.include_router(completions.router)
router.include_router(embeddings.router)
