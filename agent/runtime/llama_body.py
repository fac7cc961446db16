"""llama-server's request for an invoke, built from its typed params only (the node
checked them as an `Invoke` first): llama-server copies unknown body keys into its own
params (`grammar`, `chat_template_kwargs`, …), so nothing is passed through as it came.
`llama_request` picks the path and the body by the params' endpoint: chat
(`llama_body`), completions (`completion_body`: the prompt, a string or a list, with the
chat's token bound, sampling values and stop), embeddings (`embedding_body`: the input
list and its encoding; never streamed).

Where llama-server reads a field otherwise than OpenAI does, the mapping says so
(docs/design/gateway-openai-breadth.md, §1 and §3.4):
* a named `tool_choice` would become `auto` (llama reads a string only): only that tool
  is sent, with `required`, one call;
* `tool_choice: none` sends no tools at all (a template would still render them);
* `logprobs` without `top_logprobs` asks for none (llama's default is 20);
* `developer` is sent as `system`; a message's `name` is not sent (no template here
  reads it);
* a JSON schema goes as the client wrote it (`dump_schema`); its `name` and `strict`
  are not sent (llama reads neither: the grammar is always strict).

The prefill for tool calls (§1.1, §3.4): `required` or a named tool only constrains how
an answer ends (its grammar lets any text without the call marker come first, and the
135M model wrote prose until `max_tokens`). On the shipped `chatml-tools` template, whose
marker is known, a trailing assistant message opening the call (`<tool_call>\n`) puts
the grammar inside the call at once; llama-server continues that message and still
parses the call (`content: ""` and `tool_calls`, streamed as `delta.tool_calls`). Any
other template gets no prefill (its marker is not ours to guess), nor does a
conversation that already ends with an assistant message (the client's own prefill).
"""

from __future__ import annotations

from typing import Any, Final

from schemas.endpoints import Endpoint
from schemas.gateway import InvokeParams
from schemas.gateway_endpoints import CompletionParams, EmbeddingParams
from schemas.gateway_tools import (
    AssistantMessage,
    ChatMessage,
    JsonSchemaFormat,
    Message,
    NamedToolChoice,
    Tool,
    ToolMessage,
)
from schemas.json_schema import dump_schema
from schemas.runtime import ChatTemplate
from schemas.runtime_local import LOCAL_CHAT_COMPLETIONS, LOCAL_COMPLETIONS, LOCAL_EMBEDDINGS

# The sampling values passed on when they are set.
_SAMPLING: Final = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty")
# The assistant message that opens a call, per template that has one (ours only).
PREFILL: Final[dict[ChatTemplate, str]] = {"chatml-tools": "<tool_call>\n"}


def endpoint_of(params: InvokeParams | CompletionParams | EmbeddingParams) -> Endpoint:
    """The endpoint an invoke's params are for (a chat invoke names none)."""
    if isinstance(params, CompletionParams | EmbeddingParams):
        return params.endpoint
    return "chat"


def llama_request(
    params: InvokeParams | CompletionParams | EmbeddingParams,
    served_name: str,
    ceiling: int,
    template: ChatTemplate = "model",
) -> tuple[str, dict[str, Any]]:
    """llama-server's path and body for an invoke's params, by their endpoint."""
    if isinstance(params, CompletionParams):
        return LOCAL_COMPLETIONS, completion_body(params, served_name, ceiling)
    if isinstance(params, EmbeddingParams):
        return LOCAL_EMBEDDINGS, embedding_body(params, served_name)
    return LOCAL_CHAT_COMPLETIONS, llama_body(params, served_name, ceiling, template)


def completion_body(params: CompletionParams, served_name: str, ceiling: int) -> dict[str, Any]:
    """llama-server's completion request: the prompt (a list gives one choice each) and
    what chat sends besides its messages and tools."""
    prompt = params.prompt if isinstance(params.prompt, str) else list(params.prompt)
    body: dict[str, Any] = {"model": served_name, "prompt": prompt}
    body.update(_generation(params, ceiling))
    return body


def embedding_body(params: EmbeddingParams, served_name: str) -> dict[str, Any]:
    """llama-server's embeddings request: always a list of inputs, never streamed."""
    return {
        "model": served_name,
        "input": list(params.input),
        "encoding_format": params.encoding_format,
    }


def llama_body(
    params: InvokeParams, served_name: str, ceiling: int, template: ChatTemplate = "model"
) -> dict[str, Any]:
    """llama-server's chat request for an invoke, from its params only; `template` is the
    chat template the deployment's profile loads (for the tool-call prefill)."""
    messages = [_message(m) for m in params.messages]
    opening = _prefill(params, template)
    if opening is not None:
        messages.append({"role": "assistant", "content": opening})
    body: dict[str, Any] = {"model": served_name, "messages": messages}
    body.update(_generation(params, ceiling))
    body.update(_tools(params))
    if params.response_format is not None and params.response_format.type != "text":
        body["response_format"] = _response_format(params)
    if params.logprobs:
        body["logprobs"] = True
        body["top_logprobs"] = params.top_logprobs or 0
    return body


def _generation(params: InvokeParams | CompletionParams, ceiling: int) -> dict[str, Any]:
    """What chat and completions send alike: the token bound within the worker's
    ceiling, the stream flag, the sampling values that were set, stop, and usage for a
    stream that asked for it."""
    sent: dict[str, Any] = {
        "max_tokens": max(1, min(params.max_tokens, ceiling)),
        "stream": params.stream,
    }
    for key in _SAMPLING:
        value = getattr(params, key)
        if value is not None:
            sent[key] = value
    if params.stop:
        sent["stop"] = list(params.stop)
    if params.stream and params.include_usage:
        sent["stream_options"] = {"include_usage": True}
    return sent


def _message(message: Message) -> dict[str, Any]:
    if isinstance(message, ChatMessage):
        role = "system" if message.role == "developer" else message.role
        return {"role": role, "content": message.content}
    if isinstance(message, ToolMessage):
        return {"role": "tool", "content": message.content, "tool_call_id": message.tool_call_id}
    assert isinstance(message, AssistantMessage)
    sent: dict[str, Any] = {"role": "assistant", "content": message.content}
    if message.tool_calls is not None:
        sent["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": call.function.arguments},
            }
            for call in message.tool_calls
        ]
    return sent


def _tool(tool: Tool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.function.name}
    if tool.function.description is not None:
        function["description"] = tool.function.description
    if tool.function.parameters is not None:
        function["parameters"] = dump_schema(tool.function.parameters)
    return {"type": "function", "function": function}


def _tools(params: InvokeParams) -> dict[str, Any]:
    choice = params.tool_choice
    if params.tools is None or choice == "none":
        return {}
    if isinstance(choice, NamedToolChoice):
        named = [t for t in params.tools if t.function.name == choice.function.name]
        return {
            "tools": [_tool(t) for t in named],
            "tool_choice": "required",
            "parallel_tool_calls": False,
        }
    sent: dict[str, Any] = {"tools": [_tool(t) for t in params.tools]}
    if choice is not None:
        sent["tool_choice"] = choice
    if params.parallel_tool_calls is not None:
        sent["parallel_tool_calls"] = params.parallel_tool_calls
    return sent


def _prefill(params: InvokeParams, template: ChatTemplate) -> str | None:
    """The opening of a call to append, when a call is required and the template's
    marker is known; None otherwise."""
    opening = PREFILL.get(template)
    choice = params.tool_choice
    required = choice == "required" or isinstance(choice, NamedToolChoice)
    if opening is None or not params.tools or not required:
        return None
    if isinstance(params.messages[-1], AssistantMessage):
        return None
    return opening


def _response_format(params: InvokeParams) -> dict[str, Any]:
    wanted = params.response_format
    if isinstance(wanted, JsonSchemaFormat) and wanted.json_schema.schema_ is not None:
        return {
            "type": "json_schema",
            "json_schema": {"schema": dump_schema(wanted.json_schema.schema_)},
        }
    return {"type": "json_object"}
