"""`POST /v1/completions`: OpenAI's legacy completion, plain or streamed, for service
clients. Only the fields schemas/gateway_endpoints.py lists cross (what llama-server
would silently ignore is refused 422, naming it); the call is the one every endpoint
makes (api/gateway/call.py). llama-server puts a stream's usage on its final choice
event, asked or not: that event goes to the client whole (api/gateway/tally.py)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api.deps import State
from api.gateway.auth import ServiceClientAuth
from api.gateway.call import CallSpec
from api.gateway.errors import ERRORS
from api.gateway.params import completion_params, max_tokens
from api.gateway.serve import Arrived, serve
from api.gateway.tally import prompt_texts
from schemas.gateway_endpoints import CompletionRequest
from schemas.protocol import GATEWAY_COMPLETIONS

router = APIRouter(tags=["gateway"], responses=ERRORS)


@router.post(GATEWAY_COMPLETIONS, response_model=None)
async def completions(
    arrived: Arrived,
    scope: ServiceClientAuth,
    body: CompletionRequest,
    request: Request,
    state: State,
) -> Response:
    """A text completion of one prompt or several (a stream takes one)."""
    default = state.settings.gateway_default_max_tokens

    def spec() -> CallSpec:
        texts = prompt_texts(body.prompt)
        return CallSpec(
            endpoint="completions",
            model=body.model,
            stream=body.stream,
            params=completion_params(body, default),
            texts=texts,
            # Each prompt completes up to the bound.
            max_tokens=max_tokens(body, default) * len(texts),
            # Only a `choices: []` event would go; llama's completions send none.
            strip_usage=not (body.stream_options and body.stream_options.include_usage),
            answers_in_turn=1 if body.stream else len(texts),
        )

    return await serve(
        arrived, scope, request, state, body.model, spec, endpoint="completions",
        stream=body.stream,
    )  # fmt: skip
