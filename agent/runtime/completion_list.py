"""A whole completion for a list of prompts, one llama-server request per prompt.

The pinned llama-server answers a list of prompts with a choice per prompt but a
`usage` that counts one prompt only (tests/runtime/test_invoke_endpoints.py), and the
gateway meters a client's tokens from that usage (api/gateway/tally.py). So the worker
asks llama-server for each prompt in turn, with the same body but that prompt alone,
and answers one OpenAI `text_completion`: the first answer's id, object, created and
model, the choices re-indexed in prompt order, the usage summed.

Each answer is read within `MAX_ANSWER_BYTES` and parsed as a one-choice completion
(the node's own llama-server, trusted more than the network, still bounded): unknown
keys are dropped at the top and kept within a choice (`logprobs`, …). Any prompt's
failure is the whole invoke's, as one prompt's would be: a non-200 answer is passed on
as it came (with the usage of the prompts answered before it, generated all the same:
the gateway meters it, so a list cannot end in a refusal to spend tokens unbilled), a
broken one (cut, too long, not a completion) raises `BrokenAnswer`, which
the caller refuses `upstream_unavailable`. A cancel (the client left, a newer lease)
stops at once: the open request's connection is closed and no later prompt is asked.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

import aiohttp
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent.runtime.api import RELAY_ERRORS
from agent.runtime.server import LlamaServer
from schemas.gateway import InvokeParams
from schemas.gateway_endpoints import CompletionParams, EmbeddingParams

JSON: Final = "application/json"
# One prompt's whole answer: max_tokens is at most 8192 (schemas/gateway_fields.py), and
# a token's text, JSON-escaped, stays far below 512 bytes.
MAX_ANSWER_BYTES: Final = 4 * 1024 * 1024
# A token count no single answer reaches: bounds the sums.
MAX_COUNT: Final = 1 << 31

Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Name = Annotated[str, Field(max_length=512)]


class BrokenAnswer(Exception):
    """llama-server gave no usable answer to one of the prompts."""


class _Usage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    prompt_tokens: Count
    completion_tokens: Count
    total_tokens: Count


class _Choice(BaseModel):
    model_config = ConfigDict(extra="allow")

    index: int
    text: str
    finish_reason: Name | None = None


class Completion(BaseModel):
    """One prompt's answer as llama-server writes it, the keys the merge reads."""

    model_config = ConfigDict(extra="ignore")

    id: Name
    object: Literal["text_completion"]
    created: int
    model: Name
    system_fingerprint: Name | None = None
    choices: Annotated[list[_Choice], Field(min_length=1, max_length=1)]
    usage: _Usage


@dataclass(frozen=True)
class Answer:
    """What goes back to the gateway: llama-server's status, content type and body."""

    status: int
    content_type: str
    body: bytes


def listed_prompts(params: InvokeParams | CompletionParams | EmbeddingParams) -> list[str] | None:
    """The prompts to ask one by one: a whole completion's list of two or more (one
    prompt, or a one-element list, goes to llama-server as it is)."""
    if not isinstance(params, CompletionParams) or params.stream:
        return None
    if isinstance(params.prompt, str) or len(params.prompt) < 2:
        return None
    return list(params.prompt)


def parse(raw: bytes) -> Completion:
    """One prompt's answer, or BrokenAnswer when it is not a one-choice completion."""
    try:
        return Completion.model_validate_json(raw)
    except ValidationError as exc:
        raise BrokenAnswer(
            f"llama-server's answer is not a completion ({exc.error_count()} errors)"
        ) from None


def merge(answers: Sequence[Completion]) -> dict[str, Any]:
    """One OpenAI completion from one answer per prompt, in prompt order."""
    first = answers[0]
    merged: dict[str, Any] = {
        "id": first.id,
        "object": first.object,
        "created": first.created,
        "model": first.model,
    }
    if first.system_fingerprint is not None:
        merged["system_fingerprint"] = first.system_fingerprint
    merged["choices"] = [
        {**answer.choices[0].model_dump(), "index": index} for index, answer in enumerate(answers)
    ]
    merged["usage"] = summed(answers)
    return merged


def summed(answers: Sequence[Completion]) -> dict[str, int]:
    """The usage of these answers together."""
    return {
        key: sum(getattr(answer.usage, key) for answer in answers)
        for key in ("prompt_tokens", "completion_tokens", "total_tokens")
    }


def refused_after(status: int, raw: bytes, answers: Sequence[Completion]) -> bytes:
    """llama-server's refusal of a later prompt, with the usage of those answered before
    it (their tokens were generated)."""
    try:
        refusal = json.loads(raw)
    except (ValueError, RecursionError):
        refusal = None
    if not isinstance(refusal, dict):
        refusal = {"error": {"code": status, "message": "llama-server refused a prompt"}}
    return json.dumps({**refusal, "usage": summed(answers)}).encode()


async def complete_each(
    server: LlamaServer, path: str, body: dict[str, Any], prompts: Sequence[str]
) -> Answer:
    """Ask llama-server for each prompt in turn; the merged answer, or the first
    non-200 answer as it came."""
    answers: list[Completion] = []
    for prompt in prompts:
        status, content_type, raw = await _ask(server, path, {**body, "prompt": prompt})
        if status != 200:
            if answers:
                return Answer(status, JSON, refused_after(status, raw, answers))
            return Answer(status, content_type, raw)
        answers.append(parse(raw))
    return Answer(200, JSON, json.dumps(merge(answers)).encode())


async def _ask(server: LlamaServer, path: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
    try:
        upstream = await server.post_relayed(path, json.dumps(body).encode())
    except (*RELAY_ERRORS, RuntimeError) as exc:  # RuntimeError: its session just closed
        raise BrokenAnswer(f"llama-server did not answer ({type(exc).__name__})") from None
    try:
        raw = await _read(upstream)
    except RELAY_ERRORS:
        raise BrokenAnswer("llama-server failed mid-answer") from None
    finally:
        # Closed, not released: on a cancel, the connection's end stops llama-server.
        upstream.close()
    return upstream.status, upstream.headers.get("Content-Type", JSON), raw


async def _read(upstream: aiohttp.ClientResponse) -> bytes:
    raw = bytearray()
    async for chunk in upstream.content.iter_any():
        raw += chunk
        if len(raw) > MAX_ANSWER_BYTES:
            raise BrokenAnswer(f"llama-server's answer is over {MAX_ANSWER_BYTES} bytes")
    return bytes(raw)
