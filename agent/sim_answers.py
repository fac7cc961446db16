"""The simulated runtime's answers (agent/sim_runtime.py), in llama-server's shapes for
each endpoint: chat (`chat.completion`, streamed as `chat.completion.chunk` events),
completions (`text_completion`, one choice per prompt with the usage of all, as the
real worker merges a list's answers; streamed, the usage rides on the final choice's
event as llama-server sends it) and embeddings (a small fixed-size unit vector per
input, as floats or llama's base64 of little-endian float32, with `usage.prompt_tokens`).
The text is made up (`tok0 tok1 …`): the fleet benches measure the control plane, not
the words."""

from __future__ import annotations

import base64
import hashlib
import json
import math
import struct
import time
import uuid
from typing import Any, Final

from schemas.gateway import InvokeParams
from schemas.gateway_endpoints import CompletionParams, EmbeddingParams

# A simulated embedding's length (SmolLM2's would be 576; nothing reads the values).
EMBEDDING_SIZE: Final = 8
# The prompt's tokens, as the simulator counts them for usage.
PROMPT_TOKENS: Final = 8

Generating = InvokeParams | CompletionParams


def usage(tokens: int, prompt_tokens: int = PROMPT_TOKENS) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": tokens,
        "total_tokens": tokens + prompt_tokens,
    }


def prompt_count(params: Generating) -> int:
    """How many answers a request generates: one per prompt of a completion's list."""
    if isinstance(params, CompletionParams) and not isinstance(params.prompt, str):
        return len(params.prompt)
    return 1


def _finish(params: Generating, tokens: int) -> str:
    return "length" if tokens == params.max_tokens else "stop"


def _text(tokens: int) -> str:
    return "".join(f"tok{i} " for i in range(tokens))


def answer_id(params: Generating, invoke_id: uuid.UUID) -> str:
    prefix = "cmpl" if isinstance(params, CompletionParams) else "chatcmpl"
    return f"{prefix}-{invoke_id.hex[:16]}"


def plain_answer(params: Generating, invoke_id: uuid.UUID, model: str, tokens: int) -> bytes:
    """A whole answer of `tokens` made-up tokens (each prompt of a list gets its own)."""
    finish = _finish(params, tokens)
    if isinstance(params, CompletionParams):
        prompts = prompt_count(params)
        choices: list[dict[str, Any]] = [
            {"index": i, "text": _text(tokens), "finish_reason": finish} for i in range(prompts)
        ]
        kind = "text_completion"
        spent = usage(tokens * prompts, PROMPT_TOKENS * prompts)
    else:
        choices = [{"index": 0, "finish_reason": finish,
                    "message": {"role": "assistant", "content": _text(tokens)}}]  # fmt: skip
        kind = "chat.completion"
        spent = usage(tokens)
    return json.dumps({
        "id": answer_id(params, invoke_id), "object": kind, "created": int(time.time()),
        "model": model, "choices": choices, "usage": spent,
    }).encode()  # fmt: skip


class Events:
    """One streamed answer's events, in llama-server's shape for its endpoint."""

    def __init__(self, params: Generating, invoke_id: uuid.UUID, model: str) -> None:
        self.params = params
        self.chat = not isinstance(params, CompletionParams)
        self.base = {
            "id": answer_id(params, invoke_id),
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": int(time.time()),
            "model": model,
        }

    def event(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        payload = {**self.base, "choices": choices, **extra}
        return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"

    def choice(self, text: str | None, finish: str | None = None) -> dict[str, Any]:
        if not self.chat:
            return {"index": 0, "text": text or "", "finish_reason": finish}
        delta = {} if text is None else {"content": text}
        return {"index": 0, "delta": delta, "finish_reason": finish}

    def opening(self) -> bytes | None:
        """Chat opens with the assistant's role; a completion has no such event."""
        if not self.chat:
            return None
        return self.event([{"index": 0, "delta": {"role": "assistant", "content": ""},
                            "finish_reason": None}])  # fmt: skip

    def token_frame(self) -> tuple[bytes, bytes]:
        """A token's event around its text: built once, so a token costs a bytes join,
        not a JSON encoding (thousands of streams share the simulator's core)."""
        head, tail = self.event([self.choice("\x00")]).split(b"\\u0000")
        return head, tail

    def ending(self, tokens: int) -> list[bytes]:
        """The final choice's event and, where asked, the usage: a completion's rides on
        that final event (llama-server sends it so), chat's on an event of its own."""
        final = self.choice(None if self.chat else "", _finish(self.params, tokens))
        if not self.chat:
            return [self.event([final], usage=usage(tokens))]
        events = [self.event([final])]
        if self.params.include_usage:
            events.append(self.event([], usage=usage(tokens)))
        return events


def _unit_vector(text: str) -> list[float]:
    # Made from the text so equal inputs embed equally; unit length as llama's mean pooling.
    digest = hashlib.sha256(text.encode()).digest()
    raw = [float(digest[i] + 1) for i in range(EMBEDDING_SIZE)]
    norm = math.sqrt(sum(x * x for x in raw))
    return [x / norm for x in raw]


def embeddings_answer(params: EmbeddingParams, model: str) -> bytes:
    """llama-server's embeddings answer: one vector per input, in order."""
    data: list[dict[str, Any]] = []
    for index, text in enumerate(params.input):
        vector = _unit_vector(text)
        item: dict[str, Any] = {"index": index, "object": "embedding"}
        if params.encoding_format == "base64":
            packed = struct.pack(f"<{len(vector)}f", *vector)
            item.update(embedding=base64.b64encode(packed).decode(), encoding_format="base64")
        else:
            item["embedding"] = vector
        data.append(item)
    tokens = sum(max(1, len(text) // 4) for text in params.input)
    return json.dumps({
        "model": model, "object": "list", "data": data,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }).encode()  # fmt: skip
