"""The gateway's wire is as strict as every other (README: Wire rules): `true` is not 1,
`"1"` is not 1, `0` is not false, and a number is not text. The fields are read from
the models' JSON Schema, so a field added later is swept too."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from schemas.gateway import (
    ChatCompletionRequest,
    Invoke,
    InvokeCancel,
    InvokeParams,
    InvokeRefusal,
    StreamOptions,
)
from schemas.gateway_tools import (
    AssistantMessage,
    ChatMessage,
    FunctionCall,
    FunctionDef,
    JsonSchemaSpec,
    NamedToolChoice,
    ToolCall,
    ToolMessage,
)

pytestmark = pytest.mark.fast

MESSAGES = [{"role": "user", "content": "hi"}]
CALL: dict[str, Any] = {
    "id": "c1",
    "type": "function",
    "function": {"name": "f", "arguments": "{}"},
}
VALID: dict[type[BaseModel], dict[str, Any]] = {
    # logprobs on: top_logprobs needs it (the cross-field rule), the sweep sets one field.
    ChatCompletionRequest: {"model": "smol", "messages": MESSAGES, "logprobs": True},
    InvokeParams: {"messages": MESSAGES, "max_tokens": 4, "logprobs": True},
    ChatMessage: MESSAGES[0],
    AssistantMessage: {"role": "assistant", "tool_calls": [CALL]},
    ToolMessage: {"role": "tool", "content": "18 C", "tool_call_id": "c1"},
    ToolCall: CALL,
    FunctionCall: CALL["function"],
    FunctionDef: {"name": "f", "parameters": {"type": "object"}},
    NamedToolChoice: {"type": "function", "function": {"name": "f"}},
    JsonSchemaSpec: {"name": "answer", "schema": {"type": "object"}},
    StreamOptions: {},
    Invoke: {
        "invoke_id": str(uuid.uuid4()),
        "deployment_id": str(uuid.uuid4()),
        "gateway": uuid.uuid4().hex,
        "lease": {"lease_id": str(uuid.uuid4()), "epoch": 1},
        "params": {"messages": MESSAGES, "max_tokens": 4},
    },
    InvokeCancel: {"invoke_id": str(uuid.uuid4())},
    InvokeRefusal: {"code": "deployment_busy", "message": "busy"},
}


def _types(prop: dict[str, Any]) -> set[str]:
    """The JSON types a property takes (through anyOf and nested arrays' items)."""
    found: set[str] = set()
    if "type" in prop:
        found.add(prop["type"])
    if "const" in prop:
        found.add({bool: "boolean", int: "integer", str: "string"}[type(prop["const"])])
    for branch in prop.get("anyOf", []):
        found |= _types(branch)
    return found - {"null"}


def _fields(kind: str) -> Iterator[tuple[type[BaseModel], str]]:
    for model in VALID:
        for name, prop in model.model_json_schema()["properties"].items():
            if kind in _types(prop):
                yield model, name


def _refused(model: type[BaseModel], field: str, value: object) -> bool:
    body = {**VALID[model], field: value}
    outcomes: list[bool] = []
    # FastAPI validates the decoded body in Python mode; the runtime worker reads JSON.
    for json_mode in (False, True):
        try:
            if json_mode:
                model.model_validate_json(json.dumps(body))
            else:
                model.model_validate(body)
            outcomes.append(False)
        except ValidationError:
            outcomes.append(True)
    assert outcomes[0] == outcomes[1], f"{field}={value!r}: the two modes disagree"
    return outcomes[0]


NUMERIC = sorted(
    {(m, f) for m, f in _fields("integer")} | {(m, f) for m, f in _fields("number")},
    key=lambda pair: (pair[0].__name__, pair[1]),
)


def test_every_numeric_field_is_found() -> None:
    names = {f for m, f in NUMERIC if m is ChatCompletionRequest}
    assert {"n", "max_tokens", "temperature", "top_p", "seed"} <= names


@pytest.mark.parametrize("value", [True, False, "1", "1.0", "0"])
@pytest.mark.parametrize(("model", "field"), NUMERIC, ids=lambda x: getattr(x, "__name__", x))
def test_a_bool_or_a_string_is_not_a_number(
    model: type[BaseModel], field: str, value: object
) -> None:
    assert _refused(model, field, value)


@pytest.mark.parametrize(
    ("model", "field"), sorted(_fields("integer"), key=str), ids=lambda x: getattr(x, "__name__", x)
)
def test_an_integer_field_takes_json_schemas_integer_and_nothing_fractional(
    model: type[BaseModel], field: str
) -> None:
    """JSON Schema's 1.0 is the integer 1 (the wire rules); 1.5 is not an integer."""
    assert not _refused(model, field, 1)
    assert not _refused(model, field, 1.0)
    assert _refused(model, field, 1.5)


@pytest.mark.parametrize("value", [1, 0, "true", "1"])
@pytest.mark.parametrize(
    ("model", "field"), sorted(_fields("boolean"), key=str), ids=lambda x: getattr(x, "__name__", x)
)
def test_a_flag_takes_only_true_or_false(model: type[BaseModel], field: str, value: object) -> None:
    assert _refused(model, field, value)


@pytest.mark.parametrize("value", [1, 1.0, True])
@pytest.mark.parametrize(
    ("model", "field"),
    sorted((pair for pair in _fields("string") if pair[1] not in ("messages",)), key=str),
    ids=lambda x: getattr(x, "__name__", x),
)
def test_a_number_or_a_bool_is_not_text(model: type[BaseModel], field: str, value: object) -> None:
    assert _refused(model, field, value)


@pytest.mark.parametrize("value", [1, True, 1.0])
def test_message_fields_are_strict_too(value: object) -> None:
    for key in ("role", "content"):
        message = {**MESSAGES[0], key: value}
        assert _refused(ChatCompletionRequest, "messages", [message])


def test_n_takes_only_one() -> None:
    """OpenAI's `n`: ModelForge answers one choice, so 1 is all it takes."""
    assert not _refused(ChatCompletionRequest, "n", 1)
    for value in (True, 2, 0, -1):
        assert _refused(ChatCompletionRequest, "n", value)
