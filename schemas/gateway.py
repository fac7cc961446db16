"""The gateway's wire: what a service client may send to `POST /v1/chat/completions`
(OpenAI's body, only the fields listed here: anything else is refused, 422), and what
crosses to the node for it, the leased invoke (deployment.invoke.v1).

An invoke carries typed, bounded values only: messages, sampling parameters, a token
bound and stop strings. None of them becomes a llama-server flag, a path or a URL; the
runtime worker builds llama-server's request from them itself (agent/runtime/invoke.py)
and checks them against this model again, whatever the control plane sent.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Final, Literal

from pydantic import BeforeValidator, Field, Strict

from schemas.base import Flag, Number, WireModel, json_integer
from schemas.jobs import JobKind, LeaseFence

MAX_TOKENS_CEILING: Final = 8192
# A message's content: any text (newlines and tabs included: it is never logged, and it
# reaches llama-server only as a JSON string).
Content = Annotated[str, Strict(), Field(max_length=65_536)]
StopText = Annotated[str, Strict(), Field(min_length=1, max_length=64)]
TokenBound = Annotated[
    int, Strict(), Field(ge=1, le=MAX_TOKENS_CEILING), BeforeValidator(json_integer)
]
Seed = Annotated[int, Strict(), Field(ge=0, le=2**31 - 1), BeforeValidator(json_integer)]
# OpenAI's `n`: one choice is all ModelForge answers. An integer, not Literal[1]: a
# literal compares by equality, and `True == 1`.
Choices = Annotated[int, Strict(), Field(ge=1, le=1), BeforeValidator(json_integer)]
ModelField = Annotated[str, Strict(), Field(min_length=1, max_length=128)]
# The gateway process an invoke's answer goes back to (its instance id).
GatewayId = Annotated[str, Strict(), Field(pattern=r"^[0-9a-f]{32}$")]


class ChatMessage(WireModel):
    role: Literal["system", "user", "assistant"]
    content: Content


class StreamOptions(WireModel):
    include_usage: Flag = False


class ChatCompletionRequest(WireModel):
    """OpenAI's chat completion body, the fields ModelForge serves. `model` names a
    served model or a role."""

    model: ModelField
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=256)]
    max_tokens: TokenBound | None = None
    max_completion_tokens: TokenBound | None = None
    temperature: Annotated[Number, Field(ge=0, le=2)] | None = None
    top_p: Annotated[Number, Field(ge=0, le=1)] | None = None
    seed: Seed | None = None
    presence_penalty: Annotated[Number, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[Number, Field(ge=-2, le=2)] | None = None
    stop: StopText | Annotated[list[StopText], Field(max_length=4)] | None = None
    stream: Flag = False
    stream_options: StreamOptions | None = None
    n: Choices | None = None
    # OpenAI's end-user id: accepted, never passed on.
    user: Annotated[str, Strict(), Field(max_length=256)] | None = None


class InvokeParams(WireModel):
    """What llama-server is asked, and nothing more."""

    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=256)]
    max_tokens: TokenBound
    temperature: Annotated[Number, Field(ge=0, le=2)] | None = None
    top_p: Annotated[Number, Field(ge=0, le=1)] | None = None
    seed: Seed | None = None
    presence_penalty: Annotated[Number, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[Number, Field(ge=-2, le=2)] | None = None
    stop: Annotated[list[StopText], Field(max_length=4)] = Field(default_factory=list)
    stream: Flag = False
    include_usage: Flag = False


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
    params: InvokeParams


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
    ]
    message: Annotated[str, Strict()]


# Invoke refusals another deployment may well serve (the gateway retries them elsewhere,
# before the first byte has reached the client).
RETRYABLE_REFUSALS: Final = frozenset(
    {"deployment_busy", "deployment_draining", "deployment_not_loaded", "upstream_unavailable"}
)


class ModelEntry(WireModel):
    id: str
    object: Literal["model"] = "model"
    owned_by: str = "modelforge"
    # A served model's roles; a role's entry says `role`.
    roles: list[str] = Field(default_factory=list)
    kind: Literal["model", "role"] = "model"


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
