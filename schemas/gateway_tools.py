"""The chat completion's tools, structured output and log probabilities, as typed and
bounded wire values (schemas/gateway.py builds the request and the invoke from them):
messages by role, `tools`, `tool_choice`, `parallel_tool_calls`, `response_format`,
`logprobs`/`top_logprobs`.

The same models validate at the gateway and again on the node (a trust boundary), so
the cross-field rules live here too (`ChatFields`), each refusal naming its field:
* `top_logprobs` needs `logprobs: true`; `logprobs` with tools in a stream is refused
  (llama-server answers 400);
* `tool_choice` and `parallel_tool_calls` need `tools`, a named choice one of them;
* `tools` (a choice other than `none`) with a JSON `response_format` is refused:
  llama-server would drop the tools silently.

Every optional field added here is left out of a dump while unset (`exclude_if`), so a
plain chat invoke crosses to the node byte for byte as before these fields existed.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Strict,
    ValidationError,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from schemas.base import Flag, WireModel, json_integer
from schemas.bounded import MAX_DEPTH, depth
from schemas.json_schema import Description, RootSchema

# A message's content: any text (newlines and tabs included: it is never logged, and it
# reaches llama-server only as a JSON string).
Content = Annotated[str, Strict(), Field(max_length=65_536)]
FunctionName = Annotated[str, Strict(), Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
ToolCallId = Annotated[str, Strict(), Field(pattern=r"^[A-Za-z0-9_.:-]{1,64}$")]
MAX_TOOLS: Final = 32
MAX_TOOLS_SIZE: Final = 256 * 1024
MAX_ARGUMENTS: Final = 32 * 1024
TopLogprobs = Annotated[int, Strict(), Field(ge=0, le=20), BeforeValidator(json_integer)]


def _unset(value: Any) -> bool:
    return value is None


# An optional field that is left out of every dump while it is unset.
OMITTED: Final[Any] = Field(default=None, exclude_if=_unset)


def _object_arguments(text: str) -> str:
    # llama-server parses the arguments for templates that take them as an object: they
    # must be one, and bounded before anything recursive reads them.
    if depth(text.encode()) > MAX_DEPTH:
        raise ValueError(f"the arguments nest deeper than {MAX_DEPTH} levels")
    try:
        parsed = json.loads(text)
    except ValueError:
        raise ValueError("the arguments are not JSON") from None
    if not isinstance(parsed, dict):
        raise ValueError("the arguments are not a JSON object")
    return text


Arguments = Annotated[
    str, Strict(), Field(max_length=MAX_ARGUMENTS), AfterValidator(_object_arguments)
]


class FunctionCall(WireModel):
    name: FunctionName
    arguments: Arguments


class ToolCall(WireModel):
    """A call the model made earlier, as the client sends it back."""

    id: ToolCallId
    type: Literal["function"]
    function: FunctionCall


class ChatMessage(WireModel):
    """A system, developer (sent to llama-server as system) or user message."""

    role: Literal["system", "developer", "user"]
    content: Content
    name: FunctionName | None = OMITTED


class AssistantMessage(WireModel):
    role: Literal["assistant"]
    content: Content | None = OMITTED
    tool_calls: Annotated[list[ToolCall], Field(min_length=1, max_length=MAX_TOOLS)] | None = (
        OMITTED
    )
    # The openai SDK sends its own answers back with `refusal: null`.
    refusal: None = OMITTED
    name: FunctionName | None = OMITTED

    @model_validator(mode="after")
    def _says_something(self) -> AssistantMessage:
        if self.content is None and self.tool_calls is None:
            raise ValueError("an assistant message has content or tool_calls")
        return self


class ToolMessage(WireModel):
    """A tool's result: the control plane never runs a tool, the client does."""

    role: Literal["tool"]
    content: Content
    tool_call_id: ToolCallId


Message = Annotated[ChatMessage | AssistantMessage | ToolMessage, Discriminator("role")]
Messages = Annotated[list[Message], Field(min_length=1, max_length=256)]


def message_text(message: ChatMessage | AssistantMessage | ToolMessage) -> str:
    """The text a message puts into the prompt (the usage bound counts it)."""
    if isinstance(message, AssistantMessage):
        calls = "".join(c.function.name + c.function.arguments for c in message.tool_calls or ())
        return (message.content or "") + calls
    return message.content


class FunctionDef(WireModel):
    name: FunctionName
    description: Description | None = OMITTED
    parameters: RootSchema | None = OMITTED
    strict: Flag | None = OMITTED

    @model_validator(mode="after")
    def _takes_an_object(self) -> FunctionDef:
        if self.parameters is not None and self.parameters.type != "object":
            raise ValueError("a function's parameters are a schema of type object")
        return self


class Tool(WireModel):
    type: Literal["function"]
    function: FunctionDef


def _tools_fit(tools: list[Tool]) -> list[Tool]:
    names = [tool.function.name for tool in tools]
    if len(set(names)) != len(names):
        raise ValueError("tool names are unique")
    size = sum(len(tool.model_dump_json()) for tool in tools)
    if size > MAX_TOOLS_SIZE:
        raise ValueError(f"the tools are larger than {MAX_TOOLS_SIZE} bytes together")
    return tools


Tools = Annotated[list[Tool], Field(min_length=1, max_length=MAX_TOOLS), AfterValidator(_tools_fit)]


class ToolName(WireModel):
    name: FunctionName


class NamedToolChoice(WireModel):
    type: Literal["function"]
    function: ToolName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class TextFormat(WireModel):
    type: Literal["text"]


class JsonObjectFormat(WireModel):
    type: Literal["json_object"]


class JsonSchemaSpec(WireModel):
    model_config = ConfigDict(extra="forbid", frozen=True, serialize_by_alias=True)

    name: FunctionName
    description: Description | None = OMITTED
    schema_: RootSchema | None = Field(default=None, alias="schema", exclude_if=_unset)
    strict: Flag | None = OMITTED


class JsonSchemaFormat(WireModel):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaFormat, Discriminator("type")]


def refused(field: str, value: Any, message: str) -> ValidationError:
    """A cross-field refusal that names its field, as a validator raises it."""
    error = InitErrorDetails(
        type=PydanticCustomError("cross_field", message), loc=(field,), input=value
    )
    return ValidationError.from_exception_data("chat", [error])


class ChatFields(WireModel):
    """The fields the chat request and the invoke share beyond messages and sampling;
    each model adds its own `stream` (read here)."""

    tools: Tools | None = OMITTED
    tool_choice: ToolChoice | None = OMITTED
    parallel_tool_calls: Flag | None = OMITTED
    response_format: ResponseFormat | None = OMITTED
    logprobs: Flag | None = OMITTED
    top_logprobs: TopLogprobs | None = OMITTED

    @model_validator(mode="after")
    def _fields_agree(self) -> ChatFields:
        if self.top_logprobs is not None and not self.logprobs:
            raise refused("top_logprobs", self.top_logprobs, "top_logprobs needs logprobs: true")
        if self.logprobs and self.tools is not None and getattr(self, "stream", False):
            raise refused("logprobs", self.logprobs, "logprobs with tools cannot be streamed")
        for field in ("tool_choice", "parallel_tool_calls"):
            if getattr(self, field) is not None and self.tools is None:
                raise refused(field, getattr(self, field), f"{field} needs tools")
        choice = self.tool_choice
        names = {tool.function.name for tool in self.tools or ()}
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise refused("tool_choice", choice.function.name, "names no tool in tools")
        json_format = self.response_format is not None and self.response_format.type != "text"
        if json_format and self.tools is not None and choice != "none":
            raise refused(
                "response_format",
                self.response_format and self.response_format.type,
                "a JSON response_format with tools: llama-server would drop the tools",
            )
        return self
