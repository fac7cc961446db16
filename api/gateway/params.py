"""The invoke's params, built from a validated request of each endpoint: pure, no I/O.
Only the fields llama-server is to see cross to the node; the request's own (`model`,
`user`, `n`, `stream_options`) stay here. A stream always asks the node for its usage
(api/gateway/tally.py), whatever the client asked."""

from __future__ import annotations

from typing import Any

from schemas.gateway import ChatCompletionRequest, InvokeParams
from schemas.gateway_endpoints import (
    CompletionParams,
    CompletionRequest,
    EmbeddingParams,
    EmbeddingRequest,
)


def max_tokens(body: ChatCompletionRequest | CompletionRequest, default: int) -> int:
    """The token bound the request asked for, or the gateway's default."""
    if isinstance(body, CompletionRequest):
        return body.max_tokens or default
    return body.max_tokens or body.max_completion_tokens or default


def _stop(stop: str | list[str] | None) -> list[str]:
    return [stop] if isinstance(stop, str) else list(stop or [])


# The sampling values chat and completions share, passed on as the client set them.
_SAMPLING = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty")


def _sampling(body: ChatCompletionRequest | CompletionRequest) -> dict[str, Any]:
    return {field: getattr(body, field) for field in _SAMPLING}


def chat_params(body: ChatCompletionRequest, default_max_tokens: int) -> InvokeParams:
    # The new optional fields only when the client set them: left out, a plain chat
    # invoke is the one every node already reads (schemas/gateway_tools.py).
    optional = {
        field: getattr(body, field)
        for field in (
            "tools",
            "tool_choice",
            "parallel_tool_calls",
            "response_format",
            "logprobs",
            "top_logprobs",
        )
        if getattr(body, field) is not None
    }
    return InvokeParams(
        messages=body.messages,
        max_tokens=max_tokens(body, default_max_tokens),
        stop=_stop(body.stop),
        stream=body.stream,
        # Always, so a stream's tokens are known: taken out again for a client that did
        # not ask (api/gateway/call.py: CallSpec.strip_usage).
        include_usage=body.stream,
        **_sampling(body),
        **optional,
    )


def completion_params(body: CompletionRequest, default_max_tokens: int) -> CompletionParams:
    return CompletionParams(
        prompt=body.prompt,
        max_tokens=max_tokens(body, default_max_tokens),
        stop=_stop(body.stop),
        stream=body.stream,
        include_usage=body.stream,
        **_sampling(body),
    )


def embedding_params(body: EmbeddingRequest) -> EmbeddingParams:
    inputs = [body.input] if isinstance(body.input, str) else list(body.input)
    return EmbeddingParams(input=inputs, encoding_format=body.encoding_format)
