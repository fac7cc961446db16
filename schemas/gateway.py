"""The gateway's wire: what a service client may send to `POST /v1/chat/completions`
(OpenAI's body, only the fields listed here: anything else is refused, 422), and what
crosses to the node for it, the leased invoke (deployment.invoke.v1).

An invoke carries typed, bounded values only: messages, sampling parameters, a token
bound and stop strings, and the tools, response format and log probabilities of
schemas/gateway_tools.py (the same types on both sides, left out of the dump while
unset). None of them becomes a llama-server flag, a path or a URL; the runtime worker
builds llama-server's request from them itself (agent/runtime/llama_body.py) and checks
them against this model again, whatever the control plane sent.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Final, Literal

from pydantic import Discriminator, Field, Strict, Tag

from schemas.base import Flag, WireModel
from schemas.endpoints import Endpoint
from schemas.gateway_endpoints import CompletionParams, EmbeddingParams
from schemas.gateway_fields import MAX_TOKENS_CEILING as MAX_TOKENS_CEILING
from schemas.gateway_fields import (
    Choices,
    EndUser,
    ModelField,
    Penalty,
    Seed,
    Stop,
    StopList,
    Temperature,
    TokenBound,
    TopP,
)
from schemas.gateway_fields import (
    StreamOptions as StreamOptions,
)

# ChatMessage and Content re-exported: they were defined here first.
from schemas.gateway_tools import ChatFields, Messages
from schemas.gateway_tools import ChatMessage as ChatMessage
from schemas.gateway_tools import Content as Content
from schemas.jobs import JobKind, LeaseFence

# The gateway process an invoke's answer goes back to (its instance id).
GatewayId = Annotated[str, Strict(), Field(pattern=r"^[0-9a-f]{32}$")]


class ChatCompletionRequest(ChatFields):
    """OpenAI's chat completion body, the fields ModelForge serves. `model` names a
    served model or a role."""

    model: ModelField
    messages: Messages
    max_tokens: TokenBound | None = None
    max_completion_tokens: TokenBound | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Seed | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    stop: Stop | None = None
    stream: Flag = False
    stream_options: StreamOptions | None = None
    n: Choices | None = None
    user: EndUser | None = None


class InvokeParams(ChatFields):
    """What llama-server is asked, and nothing more."""

    messages: Messages
    max_tokens: TokenBound
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Seed | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    stop: StopList = Field(default_factory=list)
    stream: Flag = False
    include_usage: Flag = False


def _endpoint_of(params: Any) -> str:
    # A chat invoke names no endpoint: it crosses byte for byte as it did before the
    # other endpoints existed, and a node not yet upgraded still reads it.
    if isinstance(params, dict):
        endpoint = params.get("endpoint", "chat")
        return endpoint if isinstance(endpoint, str) else ""
    return str(getattr(params, "endpoint", "chat"))


# What llama-server is asked, by endpoint (schemas/endpoints.py: Endpoint).
InvokeBody = Annotated[
    Annotated[InvokeParams, Tag("chat")]
    | Annotated[CompletionParams, Tag("completions")]
    | Annotated[EmbeddingParams, Tag("embeddings")],
    Discriminator(_endpoint_of),
]


class Invoke(WireModel):
    """deployment.invoke.v1, as the runtime worker receives it on its held channel: the
    lease rides with the delivery (no claim round trip). Its answer goes back under the
    same lease (schemas/protocol.py: INVOKE_STREAM); an answer under an older epoch (the
    gateway already retried elsewhere) is refused."""

    kind: Literal[JobKind.DEPLOYMENT_INVOKE] = JobKind.DEPLOYMENT_INVOKE
    invoke_id: uuid.UUID
    deployment_id: uuid.UUID
    gateway: GatewayId
    lease: LeaseFence
    params: InvokeBody


class InvokeCancel(WireModel):
    """The invoke's client left (or the gateway gave up on it): stop, free the device."""

    invoke_id: uuid.UUID


class InvokeRefusal(WireModel):
    """The body of an invoke the runtime worker refused before llama-server answered."""

    code: Literal[
        "deployment_busy",
        "deployment_draining",
        "deployment_not_loaded",
        "upstream_unavailable",
        "invoke_invalid",
        # The deployment does not serve the invoke's endpoint (schemas/endpoints.py).
        "endpoint_not_served",
    ]
    message: Annotated[str, Strict()]


# Invoke refusals another deployment may well serve (the gateway retries them elsewhere,
# before the first byte has reached the client).
RETRYABLE_REFUSALS: Final = frozenset(
    {
        "deployment_busy",
        "deployment_draining",
        "deployment_not_loaded",
        "upstream_unavailable",
        "endpoint_not_served",
    }
)


class ModelEntry(WireModel):
    id: str
    object: Literal["model"] = "model"
    owned_by: str = "modelforge"
    # A served model's roles; a role's entry says `role`.
    roles: list[str] = Field(default_factory=list)
    kind: Literal["model", "role"] = "model"
    # The endpoints some live deployment of it serves (schemas/endpoints.py).
    endpoints: list[Endpoint] = Field(default_factory=list)


class ModelListing(WireModel):
    object: Literal["list"] = "list"
    data: list[ModelEntry]


class GatewayErrorDetail(WireModel):
    message: str
    type: str
    # The field a validation refused (`n`, `messages.0.role`), as OpenAI names it.
    param: str | None = None
    code: str
    correlation_id: str


class GatewayErrorBody(WireModel):
    """Every gateway refusal, in OpenAI's envelope (its clients read `error.message`),
    with ModelForge's code and correlation id."""

    error: GatewayErrorDetail
