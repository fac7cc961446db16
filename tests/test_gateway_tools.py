"""The chat completion's tools, structured output and log probabilities
(schemas/gateway_tools.py): what real clients send passes, each hostile or
contradictory value is refused with the field it concerns named (the gateway's `param`),
every other OpenAI field stays refused, and a plain chat invoke crosses to the node byte
for byte as before these fields existed."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from pydantic import ValidationError

from api.gateway.tally import StreamTally
from schemas.gateway import ChatCompletionRequest, Invoke, InvokeParams

pytestmark = pytest.mark.fast

USER = {"role": "user", "content": "Weather in Paris?"}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
CALL = {
    "id": "47eRVFc0qxzSO3HGQIMeid56m57e2lJE",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
SCHEMA_FORMAT = {
    "type": "json_schema",
    "json_schema": {
        "name": "Person",
        "schema": {"type": "object", "properties": {"name": {"type": "string"}}},
        "strict": True,
    },
}


def request(**fields: Any) -> dict[str, Any]:
    return {"model": "smol", "messages": [USER], **fields}


def refused_at(body: dict[str, Any]) -> str:
    """The field a refusal names, as the gateway's `param` would (api/handlers.py). The
    gateway validates the decoded body in Python mode (a 10,000-deep body does not even
    decode there: 422 body_unparseable), so this one does too."""
    with pytest.raises(ValidationError) as refused:
        ChatCompletionRequest.model_validate(body)
    return ".".join(str(part) for part in refused.value.errors()[0]["loc"])


ACCEPTED = [
    request(tools=[WEATHER]),
    request(tools=[WEATHER], tool_choice="required", parallel_tool_calls=False),
    request(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}),
    request(tools=[WEATHER], tool_choice="none", response_format={"type": "json_object"}),
    request(response_format=SCHEMA_FORMAT),
    request(response_format={"type": "text"}),
    request(logprobs=True, top_logprobs=2, stream=True),
    request(logprobs=False),
    request(messages=[
        {"role": "developer", "content": "Be brief.", "name": "ops"},
        USER,
        {"role": "assistant", "content": None, "tool_calls": [CALL], "refusal": None},
        {"role": "tool", "content": "18 C", "tool_call_id": CALL["id"]},
    ]),
]  # fmt: skip


@pytest.mark.parametrize("body", ACCEPTED)
def test_what_clients_send_is_accepted_at_the_gateway_and_on_the_node(body: dict[str, Any]) -> None:
    parsed = ChatCompletionRequest.model_validate_json(json.dumps(body))
    fields = parsed.model_dump(exclude={"model"}, exclude_none=True)
    params = InvokeParams.model_validate_json(json.dumps({**fields, "max_tokens": 8}))
    # What crosses to the node reads back the same there.
    assert InvokeParams.model_validate_json(params.model_dump_json()) == params


def _deep(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema}
    return {"type": "object", "properties": {"x": schema}}


def _tool(name: str = "f", **function: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, **function}}


REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("tool name with a slash", request(tools=[_tool("a/b")]), "tools.0.function.name"),
    ("tool name with a dot", request(tools=[_tool("a.b")]), "tools.0.function.name"),
    ("65-char tool name", request(tools=[_tool("a" * 65)]), "tools.0.function.name"),
    ("1,000,000-char description", request(tools=[_tool(description="x" * 1_000_000)]),
     "tools.0.function.description"),
    ("10,000-deep parameters", request(tools=[_tool(parameters=_deep(10_000))]),
     "tools.0.function.parameters"),
    ("unknown schema keyword", request(tools=[_tool(parameters={"type": "object", "if": {}})]),
     "tools.0.function.parameters.if"),
    ("parameters not an object", request(tools=[_tool(parameters={"type": "string"})]),
     "tools.0.function"),
    ("$ref loop in a response schema", request(response_format={"type": "json_schema",
     "json_schema": {"name": "x", "schema": {"$defs": {"A": {"$ref": "#/$defs/A"}}}}}),
     "response_format.json_schema.json_schema.schema"),
    ("duplicate tool names", request(tools=[_tool(), _tool()]), "tools"),
    ("33 tools", request(tools=[_tool(f"f{i}") for i in range(33)]), "tools"),
    ("tool_choice without tools", request(tool_choice="auto"), "tool_choice"),
    ("parallel_tool_calls without tools", request(parallel_tool_calls=True),
     "parallel_tool_calls"),
    ("named choice not in tools", request(tools=[WEATHER], tool_choice={"type": "function",
     "function": {"name": "other"}}), "tool_choice"),
    ("tools with a JSON format", request(tools=[WEATHER], response_format={"type": "json_object"}),
     "response_format"),
    ("top_logprobs without logprobs", request(top_logprobs=2), "top_logprobs"),
    ("top_logprobs 21", request(logprobs=True, top_logprobs=21), "top_logprobs"),
    ("logprobs with tools streamed", request(tools=[WEATHER], logprobs=True, stream=True),
     "logprobs"),
    ("assistant saying nothing", request(messages=[USER, {"role": "assistant"}]),
     "messages.1.assistant"),
    ("content parts", request(messages=[{"role": "user", "content": [{"type": "text",
     "text": "hi"}]}]), "messages.0.user.content"),
    ("arguments not an object", request(messages=[USER, {"role": "assistant", "tool_calls": [
     {**CALL, "function": {"name": "f", "arguments": "[1]"}}]}]),
     "messages.1.assistant.tool_calls.0.function.arguments"),
    ("tool message without its call", request(messages=[USER, {"role": "tool", "content": "x"}]),
     "messages.1.tool.tool_call_id"),
    ("unknown role", request(messages=[{"role": "function", "content": "x"}]), "messages.0"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "param"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_each_hostile_or_contradictory_value_is_refused_naming_its_field(
    body: dict[str, Any], param: str
) -> None:
    assert refused_at(body).startswith(param)


@pytest.mark.parametrize(
    "field",
    ["logit_bias", "functions", "function_call", "audio", "modalities", "prediction", "store",
     "metadata", "service_tier", "reasoning_effort", "web_search_options", "grammar",
     "json_schema", "chat_template_kwargs"],
)  # fmt: skip
def test_every_other_field_stays_refused_by_name(field: str) -> None:
    assert refused_at(request(**{field: {}})) == field


def test_a_plain_chat_invoke_is_byte_identical_on_the_wire() -> None:
    """The dump of a chat invoke without the new fields, pinned as it was before them:
    a node not yet upgraded reads it."""
    ids = uuid.UUID(int=1), uuid.UUID(int=2), uuid.UUID(int=3)
    invoke = Invoke.model_validate(
        {"invoke_id": ids[0], "deployment_id": ids[1], "gateway": "a" * 32,
         "lease": {"lease_id": ids[2], "epoch": 1},
         "params": {"messages": [{"role": "system", "content": "s"}, USER,
                                 {"role": "assistant", "content": "a"}], "max_tokens": 5}}
    )  # fmt: skip
    assert invoke.model_dump_json() == (
        '{"kind":"deployment.invoke.v1","invoke_id":"00000000-0000-0000-0000-000000000001",'
        '"deployment_id":"00000000-0000-0000-0000-000000000002","gateway":"'
        + "a"
        * 32
        + '","lease":{"lease_id":"00000000-0000-0000-0000-000000000003","epoch":1},'
        '"params":{"messages":[{"role":"system","content":"s"},'
        '{"role":"user","content":"Weather in Paris?"},{"role":"assistant","content":"a"}],'
        '"max_tokens":5,"temperature":null,"top_p":null,"seed":null,"presence_penalty":null,'
        '"frequency_penalty":null,"stop":[],"stream":false,"include_usage":false}}'
    )


def test_a_cut_tool_call_stream_is_estimated_from_its_argument_deltas() -> None:
    """A stream of tool-call deltas (llama-server's shape, design note §1.1) cut before
    its usage still counts a completion token per delta relayed."""
    first = (b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"x",'
             b'"type":"function","function":{"name":"f","arguments":"{"}}]}}]}\n\n')  # fmt: skip
    more = b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\\n  \\""}}]}}]}\n\n'  # noqa: E501
    tally = StreamTally(strip_usage=True)
    tally.feed(first + more + more)
    assert tally.tokens == (0, 3)
