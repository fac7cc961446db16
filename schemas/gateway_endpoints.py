"""The gateway's other OpenAI endpoints (issue 34): the legacy `POST /v1/completions`
and `POST /v1/embeddings`, what a service client may send to each (only the fields
listed here: anything else is refused, 422, naming the field), and the invoke params
that cross to the node for each (schemas/gateway.py: InvokeBody).

What llama-server would silently ignore is refused rather than carried, so a client
never gets an answer to a question it did not ask (docs/design/gateway-openai-breadth.md
§1.4): `echo: true`, `suffix`, `best_of`, completions' `logprobs` (llama answers in the
chat shape, not the legacy one), embeddings' `dimensions`, and token-id inputs (another
tokenizer's ids are noise to this model). A streamed completion takes one prompt:
llama-server separates a list's streams with `data: null` events no OpenAI client reads.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import AfterValidator, Field, Strict, model_validator

from schemas.base import Flag, WireModel
from schemas.gateway_fields import (
    Choices,
    EndUser,
    ModelField,
    Penalty,
    Seed,
    Stop,
    StopList,
    StreamOptions,
    Temperature,
    TokenBound,
    TopP,
)
from schemas.gateway_tools import Content, refused

MAX_PROMPTS: Final = 16
MAX_INPUTS: Final = 256
MAX_INPUT_CHARS: Final = 32_768
# All of an embeddings request's inputs together: the gateway's body bound is 1 MiB.
MAX_INPUTS_CHARS: Final = 1_048_576

Prompt = Content | Annotated[list[Content], Field(min_length=1, max_length=MAX_PROMPTS)]
EmbeddingText = Annotated[str, Strict(), Field(min_length=1, max_length=MAX_INPUT_CHARS)]


def _inputs_fit(inputs: list[str]) -> list[str]:
    if sum(len(text) for text in inputs) > MAX_INPUTS_CHARS:
        raise ValueError(f"the inputs are longer than {MAX_INPUTS_CHARS} characters together")
    return inputs


EmbeddingInputs = Annotated[
    list[EmbeddingText],
    Field(min_length=1, max_length=MAX_INPUTS),
    AfterValidator(_inputs_fit),
]
EncodingFormat = Literal["float", "base64"]


def _one_streamed_prompt(prompt: str | list[str], stream: bool) -> None:
    if stream and isinstance(prompt, list) and len(prompt) > 1:
        raise refused("prompt", len(prompt), "a streamed completion takes one prompt")


class CompletionRequest(WireModel):
    """OpenAI's (legacy) completion body, the fields ModelForge serves."""

    model: ModelField
    prompt: Prompt
    max_tokens: TokenBound | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Seed | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    stop: Stop | None = None
    stream: Flag = False
    stream_options: StreamOptions | None = None
    n: Choices | None = None
    # Accepted as false only: llama-server ignores `echo: true` (it would not echo).
    echo: Flag | None = None
    user: EndUser | None = None

    @model_validator(mode="after")
    def _served(self) -> CompletionRequest:
        if self.echo:
            raise refused("echo", self.echo, "echo: true is not served")
        _one_streamed_prompt(self.prompt, self.stream)
        return self


class EmbeddingRequest(WireModel):
    """OpenAI's embeddings body, the fields ModelForge serves. The openai SDK asks for
    base64 unless told otherwise; both forms are served."""

    model: ModelField
    input: EmbeddingText | EmbeddingInputs
    encoding_format: EncodingFormat = "float"
    user: EndUser | None = None


class CompletionParams(WireModel):
    """What llama-server's /v1/completions is asked, and nothing more."""

    endpoint: Literal["completions"] = "completions"
    prompt: Prompt
    max_tokens: TokenBound
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Seed | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    stop: StopList = Field(default_factory=list)
    stream: Flag = False
    include_usage: Flag = False

    @model_validator(mode="after")
    def _served(self) -> CompletionParams:
        _one_streamed_prompt(self.prompt, self.stream)
        return self


class EmbeddingParams(WireModel):
    """What llama-server's /v1/embeddings is asked: always a list, never streamed."""

    endpoint: Literal["embeddings"] = "embeddings"
    input: EmbeddingInputs
    encoding_format: EncodingFormat = "float"
    # An embeddings answer is never streamed; the field keeps the invoke's shape common.
    stream: Literal[False] = False
