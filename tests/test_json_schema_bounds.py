"""A client's JSON Schema (schemas/json_schema.py) is typed and bounded: the hostile ones
are refused quickly with the place named, before anything recurses into them, and the
schemas real clients send (pydantic's, the openai SDK's strict form) pass and dump back
as they came."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.lib._pydantic import to_strict_json_schema
from pydantic import BaseModel, ValidationError

from schemas.json_schema import RootSchema, dump_schema

pytestmark = pytest.mark.fast


class Address(BaseModel):
    """Where someone lives.

    Two lines, as a docstring gives them."""

    city: str
    zip_code: str | None = None


class Person(BaseModel):
    name: str
    age: int = 30
    tags: list[str] = []
    home: Address
    previous: list[Address] | None = None
    # A nested model as a default: pydantic (and instructor, sending its schema raw)
    # writes it as an object.
    work: Address = Address(city="Lyon")


@pytest.mark.parametrize("schema", [Person.model_json_schema(), to_strict_json_schema(Person)])
def test_the_schemas_clients_send_pass_and_dump_back_unchanged(schema: dict[str, Any]) -> None:
    assert dump_schema(RootSchema.model_validate_json(json.dumps(schema))) == schema


def test_a_null_const_and_integers_stay_what_they_were() -> None:
    schema = {"enum": [1, 2.5, True, None, "x"], "const": None, "minimum": 0}
    assert json.dumps(dump_schema(RootSchema.model_validate(schema))) == json.dumps(schema)


def _deep(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):  # built iteratively: nothing recursive touches it before us
        schema = {"type": "array", "items": schema}
    return schema


def _laughs(levels: int) -> dict[str, Any]:
    defs: dict[str, Any] = {"L0": {"type": "string"}}
    for i in range(1, levels):
        twice = {"$ref": f"#/$defs/L{i - 1}"}
        defs[f"L{i}"] = {"anyOf": [twice, twice]}
    return {"$defs": defs, "$ref": f"#/$defs/L{levels - 1}"}


HOSTILE: list[tuple[str, Any, tuple[Any, ...], str]] = [
    ("10,000 deep", _deep(10_000), (), "nests deeper than 32"),
    ("500 deep", _deep(500), (), "nests deeper than 32"),
    ("1,000,000-char description", {"description": "x" * 1_000_000}, (), "larger than"),
    ("long description", {"description": "x" * 4097}, ("description",), "at most 4096"),
    ("self $ref", {"$defs": {"A": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"}, (), "cycle"),
    ("2-cycle", {"$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}}}, (), "cycle"),
    ("cycle via anyOf/items",
     {"$defs": {"A": {"items": {"$ref": "#/$defs/B"}}, "B": {"anyOf": [{"$ref": "#/$defs/A"}]}},
      "$ref": "#/$defs/A"}, (), "cycle"),
    ("billion laughs", _laughs(30), (), "expands past 4096"),
    ("remote $ref", {"$ref": "http://x/y"}, ("$ref",), "match pattern"),
    ("pointer $ref", {"$ref": "#/properties/x"}, ("$ref",), "match pattern"),
    ("missing definition", {"$ref": "#/$defs/Nope"}, (), "names no definition"),
    ("if", {"if": {}}, ("if",), "Extra inputs"),
    ("patternProperties", {"patternProperties": {}}, ("patternProperties",), "Extra inputs"),
    ("$id", {"$id": "x"}, ("$id",), "Extra inputs"),
    ("nested unknown", {"properties": {"x": {"then": {}}}}, ("properties", "x", "then"),
     "Extra inputs"),
    ("$defs below the root", {"items": {"$defs": {}}}, ("items", "$defs"), "Extra inputs"),
    ("maxLength 5000", {"maxLength": 5000}, ("maxLength",), "less than or equal to 1000"),
    ("unanchored pattern", {"pattern": "abc"}, ("pattern",), "match pattern"),
    ("bad pattern", {"pattern": "^(abc$"}, ("pattern",), "does not compile"),
    ("required names no property", {"properties": {"a": {}}, "required": ["b"]}, (),
     "required names no property: b"),
    ("object in enum", {"enum": [{"a": 1}]}, ("enum", 0), ""),
    ("string for a bound", {"minimum": "1"}, ("minimum",), ""),
]  # fmt: skip


@pytest.mark.parametrize(("schema", "loc", "says"), [h[1:] for h in HOSTILE],
                         ids=[h[0] for h in HOSTILE])  # fmt: skip
def test_a_hostile_schema_is_refused_quickly_with_its_place(
    schema: Any, loc: tuple[Any, ...], says: str
) -> None:
    started = time.perf_counter()
    with pytest.raises(ValidationError) as refused:
        RootSchema.model_validate(schema)
    assert time.perf_counter() - started < 0.05
    first = refused.value.errors()[0]
    assert first["loc"][: len(loc)] == loc
    assert says in first["msg"]


def test_a_10000_deep_schema_as_text_is_refused_by_the_parser_first() -> None:
    raw = '{"items":' * 10_000 + "{}" + "}" * 10_000
    with pytest.raises(ValidationError):
        RootSchema.model_validate_json(raw)


def test_many_containers_are_refused_however_shallow() -> None:
    wide: dict[str, dict[str, Any]] = {
        "properties": {f"p{i}": {"anyOf": [{}, {}]} for i in range(120)}
    }
    wide["properties"].update({f"q{i}": {"enum": [1]} for i in range(8)})
    RootSchema.model_validate(wide)  # 128 properties, under 1024 containers
    with pytest.raises(ValidationError, match="more than 1024 objects and arrays"):
        RootSchema.model_validate({"anyOf": [{"anyOf": [{}] * 32}] * 32})


_names = st.from_regex(r"[a-z][a-z0-9_]{0,7}", fullmatch=True)
_leaves = st.one_of(
    st.sampled_from(["string", "number", "integer", "boolean", "null"]).map(lambda t: {"type": t}),
    st.integers(0, 1000).map(lambda n: {"type": "string", "maxLength": n}),
    st.lists(st.integers(-100, 100) | st.text(max_size=8), min_size=1, max_size=4).map(
        lambda values: {"enum": values}
    ),
    st.just({"const": None}),
)


def _objects(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(_names, children, max_size=4).map(
        lambda props: {"type": "object", "properties": props, "required": sorted(props),
                       "additionalProperties": False}
    )  # fmt: skip


_schemas = st.recursive(
    _leaves,
    lambda children: st.one_of(
        _objects(children),
        children.map(lambda item: {"type": "array", "items": item, "maxItems": 8}),
        st.lists(children, min_size=1, max_size=3).map(lambda branches: {"anyOf": branches}),
    ),
    max_leaves=24,
)


@settings(max_examples=100, deadline=None)
@given(schema=_schemas)
def test_a_schema_within_the_bounds_passes_and_dumps_back_the_same(schema: dict[str, Any]) -> None:
    """Whatever the allow-list admits within the bounds validates, and reads back as the
    same JSON value (keys in the model's order: equal as values, not as bytes)."""
    parsed = RootSchema.model_validate_json(json.dumps(schema))
    assert dump_schema(parsed) == schema
    assert RootSchema.model_validate_json(parsed.model_dump_json()) == parsed
