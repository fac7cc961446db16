"""`POST /v1/embeddings` for service clients: never streamed, so the answer is held
whole (bounded: api/gateway/call.py, MAX_PLAIN_ANSWER_BYTES) and retried elsewhere
until then. Floats or base64 as the client asks (the openai SDK asks base64); what
llama-server would ignore (`dimensions`, token-id inputs) is refused 422, naming it
(schemas/gateway_endpoints.py). Its usage counts input tokens only."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api.deps import State
from api.gateway.auth import ServiceClientAuth
from api.gateway.call import CallSpec
from api.gateway.errors import ERRORS
from api.gateway.params import embedding_params
from api.gateway.serve import Arrived, serve
from api.gateway.tally import prompt_texts
from schemas.gateway_endpoints import EmbeddingRequest
from schemas.protocol import GATEWAY_EMBEDDINGS

router = APIRouter(tags=["gateway"], responses=ERRORS)


@router.post(GATEWAY_EMBEDDINGS, response_model=None)
async def embeddings(
    arrived: Arrived,
    scope: ServiceClientAuth,
    body: EmbeddingRequest,
    request: Request,
    state: State,
) -> Response:
    """One vector per input, in the order given."""

    def spec() -> CallSpec:
        params = embedding_params(body)
        return CallSpec(
            endpoint="embeddings",
            model=body.model,
            stream=False,
            params=params,
            texts=prompt_texts(params.input),
            # Nothing is completed: a reported completion is no one's to pay.
            max_tokens=0,
            strip_usage=True,
        )

    return await serve(
        arrived, scope, request, state, body.model, spec, endpoint="embeddings", stream=False
    )
