"""The workloads of ops/bench/gateway.py (issue 34, docs/design/gateway-openai-breadth.md
§8): what the deployment and the direct llama-server are given, and the two bodies.

Both sides ask llama-server the same thing. The deployment's profile and endpoints make
the direct server's argv too, through the worker's own `server_argv` (ModelSpec from the
same settings): `chat_template: chatml-tools` gives `--chat-template-file` on the shipped
template, embeddings give `--embeddings` and the profile's `--pooling mean`. The direct
body is the one the worker would send for the gateway's body: the gateway's own params
(api/gateway/params.py) then the worker's `llama_request` (agent/runtime/llama_body.py),
so the tool-call prefill and `stream_options` are on both sides. Plain chat keeps the
body it always had (the same on both sides), so its figures stay comparable.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from agent.runtime.config import ModelSpec, RuntimeConfig
from agent.runtime.llama_body import llama_request
from agent.runtime.server import server_argv
from api.gateway.params import chat_params, embedding_params
from schemas.endpoints import Endpoint
from schemas.gateway import ChatCompletionRequest
from schemas.gateway_endpoints import EmbeddingRequest
from schemas.protocol import GATEWAY_CHAT_COMPLETIONS, GATEWAY_EMBEDDINGS
from schemas.runtime_local import LOCAL_CHAT_COMPLETIONS

NAMES: Final = ("chat", "tools", "json_schema", "embeddings")
MODEL: Final = "smol"
# The profile every workload starts from: llama-server queues on both paths.
BASE_SETTINGS: Final[dict[str, Any]] = {
    "ctx_size": 2048,
    "threads": 2,
    "server_args": {"parallel": 4},
}
# The worker's defaults: what bounds max_tokens on its side.
CEILING: Final = int(RuntimeConfig.model_fields["max_tokens_ceiling"].default)
EMBEDDING_INPUTS: Final = [
    "The cluster scheduler placed the model on the least loaded GPU.",
    "A heartbeat arrives from every node every fifteen seconds.",
    "Tokens stream back to the client as server-sent events.",
    "The gateway refuses fields it does not carry with a 422.",
    "Embeddings are pooled by their mean over the input tokens.",
    "An operator rotates the service client's secret at night.",
    "The runtime worker restarts llama-server when a model changes.",
    "Usage is counted per client, in tokens in and tokens out.",
]
TOOL: Final[dict[str, Any]] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 32},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
PERSON: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 32},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 32},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class Workload:
    name: str
    # The profile's settings (the deployment's) and, None for the default, its endpoints.
    settings: dict[str, Any]
    endpoints: list[Endpoint] | None
    gateway_path: str
    gateway_body: dict[str, Any]
    direct_path: str
    direct_body: dict[str, Any]
    # What the bench reads: a stream's first token (TTFT), or requests/s (embeddings).
    streamed: bool = True

    def direct_argv(self, binary: Path, model_file: Path, port: int) -> list[str]:
        """The direct llama-server's argv: the worker's, for the same settings."""
        spec = ModelSpec.model_validate({
            "model_id": MODEL, "path": model_file, **self.settings,
            **({"endpoints": self.endpoints} if self.endpoints else {}),
        })  # fmt: skip
        return server_argv(binary, spec, port)


def workload(name: str, chat_body: dict[str, Any], threads: int = 2) -> Workload:
    """The named workload; `chat_body` is plain chat's (ops/bench/gateway.py's own),
    `threads` llama-server's on both sides."""
    base = {**BASE_SETTINGS, "threads": threads}
    if name == "chat":
        return Workload("chat", base, None, GATEWAY_CHAT_COMPLETIONS, chat_body,
                        LOCAL_CHAT_COMPLETIONS, chat_body)  # fmt: skip
    if name == "tools":
        settings = {**base, "chat_template": "chatml-tools"}
        body = {"model": MODEL, "max_tokens": 32, "temperature": 0, "stream": True,
                "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
                "tools": [TOOL], "tool_choice": "required"}  # fmt: skip
        return _chat_workload(name, settings, body)
    if name == "json_schema":
        return _json_schema_workload(name, PERSON, base)
    if name == "embeddings":
        server_args = {**BASE_SETTINGS["server_args"], "pooling": "mean"}
        settings = {**base, "server_args": server_args}
        body = {"model": MODEL, "input": EMBEDDING_INPUTS, "encoding_format": "base64"}
        params = embedding_params(EmbeddingRequest.model_validate(body))
        path, direct = llama_request(params, MODEL, CEILING)
        return Workload(name, settings, ["embeddings"], GATEWAY_EMBEDDINGS, body, path, direct,
                        streamed=False)  # fmt: skip
    raise ValueError(f"unknown workload {name!r}: one of {', '.join(NAMES)}")


def widest_schema(threads: int = 2) -> Workload:
    """json_schema with the widest object the bounds allow at the repetition bound
    (schemas/json_schema.py): 128 required strings of maxLength 1000, the grammar's
    cost rather than the gateway's (measured once, both ways)."""
    names = [f"field_{index:03}" for index in range(128)]
    schema = {
        "type": "object",
        "properties": {each: {"type": "string", "maxLength": 1000} for each in names},
        "required": names,
        "additionalProperties": False,
    }
    settings = {**BASE_SETTINGS, "threads": threads}
    return _json_schema_workload("json_schema_widest", schema, settings)


def _json_schema_workload(name: str, schema: dict[str, Any], settings: dict[str, Any]) -> Workload:
    body = {"model": MODEL, "max_tokens": 32, "temperature": 0, "stream": True,
            "messages": [{"role": "user",
                          "content": "Invent a person: a name, an age and a city."}],
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "person", "schema": schema, "strict": True}}}  # fmt: skip
    return _chat_workload(name, settings, body)


def _chat_workload(name: str, settings: dict[str, Any], body: dict[str, Any]) -> Workload:
    params = chat_params(ChatCompletionRequest.model_validate(body), CEILING)
    path, direct = llama_request(params, MODEL, CEILING, settings.get("chat_template", "model"))
    return Workload(name, settings, None, GATEWAY_CHAT_COMPLETIONS, body, path, direct)
