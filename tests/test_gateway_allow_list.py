"""The README's tables of the gateway's OpenAI fields (README: "What the gateway carries,
and what it refuses") against the request models and the installed openai SDK, so the
allow-list and what the README says of it cannot drift apart:

* a table's carried fields are exactly its request model's properties
  (`model_json_schema()["properties"]`): a field added to a model and not to the README,
  or listed and not there, fails;
* every field of the SDK's create-params TypedDicts for that endpoint is carried or
  listed as refused: a field a newer SDK adds fails here until the README decides it;
* every refused field (the SDK's and llama-server's extensions the README lists) is
  refused by the model, with the field as the error's location, which the gateway
  answers 422 with `param` naming it (api/handlers.py: gateway_error);
* the JSON Schema keyword list is exactly what schemas/json_schema.py admits, and the
  bounds the README states are that module's.

Nothing here is a copy of an answer: the fields come from the models, the SDK and the
README, and each refused field's value is built from the SDK's own type for it.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Required, get_args, get_origin

import pytest
from openai.types import completion_create_params, embedding_create_params
from openai.types.chat import completion_create_params as chat_create_params
from pydantic import BaseModel, ValidationError
from typing_extensions import is_typeddict

from schemas.bounded import MAX_DEPTH
from schemas.gateway import ChatCompletionRequest
from schemas.gateway_endpoints import CompletionRequest, EmbeddingRequest
from schemas.json_schema import (
    MAX_CONTAINERS,
    MAX_DEFINITIONS,
    MAX_EXPANDED,
    MAX_REPEAT,
    MAX_SIZE,
    Format,
    RootSchema,
    SchemaNode,
)

pytestmark = pytest.mark.fast

README = Path(__file__).resolve().parent.parent / "README.md"
ROW = re.compile(r"^\| `(?P<field>[^`]+)` \| (?P<verdict>carried|refused) \| (?P<why>.*\S) \|$")
# Values for a field the SDK does not type (llama-server's extensions): each kind of JSON.
ANY_JSON: list[Any] = ["x", 1, 0.5, True, {}, [], None]


@dataclass(frozen=True)
class Endpoint:
    table: str  # the README markers' name
    model: type[BaseModel]
    sdk: tuple[type, ...]  # the SDK's TypedDicts of the create call's body
    minimal: dict[str, Any]  # a body the model accepts, which a refused field is added to


ENDPOINTS = [
    Endpoint(
        "chat",
        ChatCompletionRequest,
        # The streaming form adds `stream` to the base.
        (
            chat_create_params.CompletionCreateParamsBase,
            chat_create_params.CompletionCreateParamsStreaming,
        ),
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    ),
    Endpoint(
        "completions",
        CompletionRequest,
        (
            completion_create_params.CompletionCreateParamsBase,
            completion_create_params.CompletionCreateParamsStreaming,
        ),
        {"model": "m", "prompt": "hi"},
    ),
    Endpoint(
        "embeddings",
        EmbeddingRequest,
        (embedding_create_params.EmbeddingCreateParams,),
        {"model": "m", "input": "hi"},
    ),
]
IDS = [endpoint.table for endpoint in ENDPOINTS]


def marked(name: str) -> str:
    """The README's text between `<!-- gateway-fields:NAME:begin -->` and its end."""
    text = README.read_text()
    begin, end = f"<!-- gateway-fields:{name}:begin -->", f"<!-- gateway-fields:{name}:end -->"
    assert text.count(begin) == 1 and text.count(end) == 1, f"README: the {name} markers"
    return text.split(begin, 1)[1].split(end, 1)[0]


def table(name: str) -> dict[str, str]:
    """A table's rows: field -> carried | refused; every field row well formed, once."""
    rows: dict[str, str] = {}
    for line in marked(name).splitlines():
        if not line.startswith("| `"):
            continue
        row = ROW.match(line)
        assert row, f"README {name} table: a row not `field` | carried/refused | why: {line}"
        assert row["field"] not in rows, f"README {name} table: {row['field']} twice"
        rows[row["field"]] = row["verdict"]
    assert rows, f"README {name} table: no rows"
    return rows


def listed(name: str, verdict: str) -> set[str]:
    return {field for field, said in table(name).items() if said == verdict}


def properties(model: type[BaseModel]) -> set[str]:
    return set(model.model_json_schema()["properties"])


def sdk_fields(endpoint: Endpoint) -> dict[str, Any]:
    """Each field of the SDK's TypedDicts and its type (Required/NotRequired dropped)."""
    fields: dict[str, Any] = {}
    for typed in endpoint.sdk:
        fields.update(typing.get_type_hints(typed))
    return fields


def required_keys(typed_dict: Any) -> dict[str, Any]:
    """A TypedDict's required keys and their types. The SDK's modules postpone their
    annotations, so `__required_keys__` misses `Required[...]`: read it off the hints."""
    hints = typing.get_type_hints(typed_dict, include_extras=True)
    marked_required = {key for key, hint in hints.items() if get_origin(hint) is Required}
    required = marked_required | set(getattr(typed_dict, "__required_keys__", ()))
    plain = typing.get_type_hints(typed_dict)
    return {key: plain[key] for key in sorted(required)}


def sample(hint: Any, depth: int = 0) -> Any:
    """A plausible JSON value of an SDK type: what a client of that SDK would send."""
    origin, args = get_origin(hint), get_args(hint)
    if depth > 6:
        return "x"
    if origin is Literal:
        return args[0]
    if origin in (typing.Union, types.UnionType):
        chosen = [arg for arg in args if arg is not type(None)]
        return sample(chosen[0], depth + 1)
    if is_typeddict(hint):
        return {key: sample(typed, depth + 1) for key, typed in required_keys(hint).items()}
    if isinstance(origin, type) and issubclass(origin, Mapping):
        return {"x": sample(args[1], depth + 1) if args else "x"}
    if isinstance(origin, type) and issubclass(origin, Iterable):
        return [sample(args[0], depth + 1)] if args else []
    if hint is bool:
        return True
    if hint is int:
        return 1
    if hint is float:
        return 0.5
    return "x"


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=IDS)
def test_the_carried_fields_are_the_models_properties(endpoint: Endpoint) -> None:
    carried = listed(endpoint.table, "carried")
    served = properties(endpoint.model)
    assert carried - served == set(), f"README carries what {endpoint.model.__name__} has not"
    assert served - carried == set(), f"{endpoint.model.__name__} has fields the README omits"
    assert listed(endpoint.table, "refused") & served == set()


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=IDS)
def test_every_sdk_field_is_carried_or_refused(endpoint: Endpoint) -> None:
    fields = sdk_fields(endpoint)
    assert "model" in fields, "the SDK's TypedDicts were not read"
    said = set(table(endpoint.table))
    unsaid = sorted(set(fields) - said)
    assert unsaid == [], f"SDK fields the README's {endpoint.table} table does not decide"


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=IDS)
def test_each_refused_field_is_refused_naming_it(endpoint: Endpoint) -> None:
    endpoint.model.model_validate(endpoint.minimal)
    typed = sdk_fields(endpoint)
    for field in sorted(listed(endpoint.table, "refused")):
        values = [sample(typed[field])] if field in typed else ANY_JSON
        for value in values:
            with pytest.raises(ValidationError) as refused:
                endpoint.model.model_validate({**endpoint.minimal, field: value})
            located = [error["loc"][:1] for error in refused.value.errors()]
            assert located == [(field,)], (field, value, refused.value.errors())


def test_the_sample_values_are_what_the_sdk_types_say() -> None:
    """The refused fields' values are of their SDK type (a check of `sample` itself)."""
    chat = sdk_fields(ENDPOINTS[0])
    assert isinstance(sample(chat["logit_bias"]), dict)
    assert isinstance(sample(chat["functions"]), list) and sample(chat["functions"])[0]["name"]
    assert sample(chat["reasoning_effort"]) in get_args(get_args(chat["reasoning_effort"])[0])
    assert sample(sdk_fields(ENDPOINTS[2])["dimensions"]) == 1


def test_the_json_schema_keywords_are_the_models() -> None:
    """The README's keyword list is what schemas/json_schema.py admits (its keywords by
    their JSON names), the root-only ones last; its bounds are that module's."""
    text = " ".join(marked("json-schema").split())
    everywhere, root_only = text.split("at the root only", 1)
    spelled = {name: field.alias or name for name, field in RootSchema.model_fields.items()}
    node = {spelled[name] for name in SchemaNode.model_fields}
    assert set(re.findall(r"`([^`]+)`", everywhere)) == node
    assert set(re.findall(r"`([^`]+)`", root_only)) == set(spelled.values()) - node

    readme = " ".join(README.read_text().split())
    section = readme.split("<!-- gateway-fields:json-schema:end -->", 1)[1][:3000]
    for stated in (
        f"at most {MAX_DEPTH} levels, {MAX_CONTAINERS:,} objects and arrays, "
        f"{MAX_SIZE // 1024} KiB",
        f"at most {MAX_DEFINITIONS} definitions",
        f"at most {MAX_EXPANDED:,} nodes",
        f"`maxItems` at most {MAX_REPEAT:,}",
    ):
        assert stated in section, f"README's JSON Schema bounds: {stated!r}"
    for format_name in get_args(Format):
        assert f"`{format_name}`" in section or format_name.startswith("uuid"), format_name
