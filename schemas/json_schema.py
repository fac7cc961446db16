"""A JSON Schema as a client may send it (a tool's `parameters`, a `response_format`'s
`schema`): typed and bounded, never raw JSON. llama-server turns it into a grammar
(common/json-schema.cpp), so what it may hold is what that reads, plus the annotations
pydantic and the openai SDK emit; everything else is refused.

* **Keywords**: `extra="forbid"` is the allow-list: an unknown keyword (`if`,
  `patternProperties`, `$id`) is refused with its path.
* **Size, before anything recurses**: `_walk` measures the raw value with a stack of
  its own (no recursion): at most MAX_DEPTH levels, MAX_CONTAINERS objects and arrays,
  MAX_SIZE characters; a 10,000-deep schema never reaches the recursive validation.
* **References**: `$ref` is local only (`#/$defs/Name`, `#/definitions/Name`), names a
  definition that exists, and never loops (llama would take a loop; refusing it keeps
  the bound below a plain number). Every reference inlined, the schema is at most
  MAX_EXPANDED nodes, which refuses the `$defs` "billion laughs".
* **Cost**: string and array bounds at most MAX_REPEAT (each is a grammar repetition);
  a `pattern` is anchored `^…$` (llama treats any other as "any string") and compiles.

The same model validates at the gateway and again on the node.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    SerializerFunctionWrapHandler,
    Strict,
    model_serializer,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from schemas.base import NO_CONTROL_CHARACTERS, SAFE_INT_MAX, Flag, Integer, Number, WireModel
from schemas.bounded import MAX_DEPTH

MAX_CONTAINERS: Final = 1024
MAX_SIZE: Final = 32_768
MAX_EXPANDED: Final = 4096
MAX_REPEAT: Final = 1000
MAX_DEFINITIONS: Final = 64

SchemaType = Literal["string", "number", "integer", "boolean", "object", "array", "null"]
PropertyName = Annotated[
    str, Strict(), Field(min_length=1, max_length=64, pattern=NO_CONTROL_CHARACTERS)
]
DefinitionName = Annotated[str, Strict(), Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
REF_PATTERN: Final = r"^#/(\$defs|definitions)/[A-Za-z0-9_.-]{1,64}$"
# A value in `enum`, `const`, `default`, `examples`. Ordered so that an integer stays an
# integer (llama writes `enum: [1]` into the grammar as it reads it: 1.0 is not 1).
LeafText = Annotated[str, Strict(), Field(max_length=1024)]
JsonLeaf = Flag | Integer | Number | LeafText | None
Repeat = Annotated[int, Strict(), Field(ge=0, le=MAX_REPEAT)]
Bound = Integer | Annotated[Number, Field(ge=-SAFE_INT_MAX, le=SAFE_INT_MAX)]
Description = Annotated[str, Strict(), Field(max_length=4096)]
# Enforced by llama-server's grammar: date, time, date-time, uuid*; the others are taken
# as any string (accepted: pydantic emits them for EmailStr, AnyUrl, …).
Format = Literal[
    "date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5",
    "email", "uri", "hostname", "ipv4", "ipv6",
]  # fmt: skip
SchemaDialect = Literal[
    "http://json-schema.org/draft-07/schema#",
    "http://json-schema.org/draft-07/schema",
    "https://json-schema.org/draft/2020-12/schema",
]


def _compiles(pattern: str) -> str:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"the pattern does not compile ({exc.msg})") from None
    return pattern


Pattern = Annotated[
    str, Strict(), Field(max_length=512, pattern=r"^\^[\s\S]*\$$"), AfterValidator(_compiles)
]


def _walk(value: Any) -> Any:
    """The raw schema's depth, containers and size, counted without recursion."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    containers = 0
    size = 0
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Iterator[Any] | list[Any] = iter(item.values())
            size += sum(len(str(key)) + 4 for key in item)
        elif isinstance(item, list):
            children = item
        else:
            size += len(item) + 2 if isinstance(item, str) else 8
            if size > MAX_SIZE:
                raise ValueError(f"the schema is larger than {MAX_SIZE} characters")
            continue
        containers += 1
        if level > MAX_DEPTH:
            raise ValueError(f"the schema nests deeper than {MAX_DEPTH} levels")
        if containers > MAX_CONTAINERS:
            raise ValueError(f"the schema holds more than {MAX_CONTAINERS} objects and arrays")
        if size > MAX_SIZE:
            raise ValueError(f"the schema is larger than {MAX_SIZE} characters")
        stack.extend((child, level + 1) for child in children)
    return value


def _without_serializer(core_schema: Any) -> Any:
    """The core schema down its `schema` chain (the model validators' wrappers, then the
    model), less the model's serializer."""
    if not isinstance(core_schema, dict):
        return core_schema
    copied = {k: v for k, v in core_schema.items() if k != "serialization"}
    if "schema" in copied:
        copied["schema"] = _without_serializer(copied["schema"])
    return copied


class SchemaNode(WireModel):
    """One schema (sub)object: the keywords llama-server reads, and annotations."""

    model_config = ConfigDict(extra="forbid", frozen=True, serialize_by_alias=True)

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        # Dumped as it was read (`_as_written`): its schema is the validation one, which
        # a wrap serializer would otherwise hide (`{}`).
        return handler(_without_serializer(core_schema))

    type: SchemaType | Annotated[list[SchemaType], Field(min_length=1, max_length=7)] | None = None
    properties: Annotated[dict[PropertyName, SchemaNode], Field(max_length=128)] | None = None
    required: Annotated[list[PropertyName], Field(max_length=128)] | None = None
    additionalProperties: Flag | SchemaNode | None = None
    items: SchemaNode | None = None
    prefixItems: Annotated[list[SchemaNode], Field(max_length=32)] | None = None
    anyOf: Annotated[list[SchemaNode], Field(min_length=1, max_length=32)] | None = None
    oneOf: Annotated[list[SchemaNode], Field(min_length=1, max_length=32)] | None = None
    allOf: Annotated[list[SchemaNode], Field(min_length=1, max_length=32)] | None = None
    enum: Annotated[list[JsonLeaf], Field(min_length=1, max_length=256)] | None = None
    const: JsonLeaf = None
    # A leaf, a list of leaves, or an object of them: pydantic writes a nested model's
    # default as an object. Not any JSON: a recursive type here makes every generator of
    # this schema (schemathesis, hypothesis) wander without bound.
    default: (
        JsonLeaf
        | Annotated[list[JsonLeaf], Field(max_length=64)]
        | Annotated[dict[PropertyName, JsonLeaf | list[JsonLeaf]], Field(max_length=64)]
    ) = None
    examples: Annotated[list[JsonLeaf], Field(max_length=8)] | None = None
    minItems: Repeat | None = None
    maxItems: Repeat | None = None
    minLength: Repeat | None = None
    maxLength: Repeat | None = None
    minimum: Bound | None = None
    maximum: Bound | None = None
    exclusiveMinimum: Bound | None = None
    exclusiveMaximum: Bound | None = None
    multipleOf: Bound | None = None  # not enforced by the grammar
    pattern: Pattern | None = None
    format: Format | None = None
    title: Annotated[str, Strict(), Field(max_length=256)] | None = None
    description: Description | None = None
    comment: Annotated[str, Strict(), Field(max_length=1024)] | None = Field(
        default=None, alias="$comment"
    )
    deprecated: Flag | None = None
    readOnly: Flag | None = None
    writeOnly: Flag | None = None
    ref: Annotated[str, Strict(), Field(pattern=REF_PATTERN)] | None = Field(
        default=None, alias="$ref"
    )

    @model_serializer(mode="wrap")
    def _as_written(self, handler: SerializerFunctionWrapHandler) -> Any:
        # Only the keywords the client wrote, whichever dump (the invoke's included): an
        # unset keyword is not `null` (`const: null` is a value, kept when written).
        dumped = handler(self)
        written = set(self.model_fields_set)
        written |= {type(self).model_fields[f].alias or f for f in self.model_fields_set}
        return {key: value for key, value in dumped.items() if key in written}

    @model_validator(mode="after")
    def _required_are_properties(self) -> SchemaNode:
        missing = set(self.required or ()) - set(self.properties or {})
        if missing:
            raise ValueError(f"required names no property: {', '.join(sorted(missing))}")
        return self

    def children(self) -> Iterator[SchemaNode]:
        yield from (self.properties or {}).values()
        if isinstance(self.additionalProperties, SchemaNode):
            yield self.additionalProperties
        if self.items is not None:
            yield self.items
        for group in (self.prefixItems, self.anyOf, self.oneOf, self.allOf):
            yield from group or ()


Definitions = Annotated[dict[DefinitionName, SchemaNode], Field(max_length=MAX_DEFINITIONS)]


class RootSchema(SchemaNode):
    """A whole schema: its definitions and dialect live at the root only."""

    defs: Definitions | None = Field(default=None, alias="$defs")
    definitions: Definitions | None = None
    dialect: SchemaDialect | None = Field(default=None, alias="$schema")

    @model_validator(mode="before")
    @classmethod
    def _bounded(cls, value: Any) -> Any:
        return _walk(value)

    @model_validator(mode="after")
    def _refs_closed(self) -> RootSchema:
        named: dict[str, SchemaNode] = {}
        for prefix, group in (("#/$defs/", self.defs), ("#/definitions/", self.definitions)):
            named.update({prefix + name: node for name, node in (group or {}).items()})
        # Each definition's own nodes and the references in it, then the definitions in
        # an order where each comes after those it refers to (none left over: a cycle).
        local = {ref: _local(node) for ref, node in named.items()}
        for _, refs in (*local.values(), _local(self)):
            for ref in refs:
                if ref not in named:
                    raise ValueError(f"$ref names no definition: {ref}")
        expanded: dict[str, int] = {}
        waiting = dict(local)
        while waiting:
            ready = [ref for ref, (_, refs) in waiting.items() if all(r in expanded for r in refs)]
            if not ready:
                raise ValueError(f"$ref cycle through {min(waiting)}")
            for ref in ready:
                nodes, refs = waiting.pop(ref)
                expanded[ref] = min(MAX_EXPANDED + 1, nodes + sum(expanded[r] for r in refs))
        nodes, refs = _local(self)
        if nodes + sum(expanded[r] for r in refs) > MAX_EXPANDED or any(
            size > MAX_EXPANDED for size in expanded.values()
        ):
            raise ValueError(f"the schema expands past {MAX_EXPANDED} nodes ($ref inlined)")
        return self


def _local(root: SchemaNode) -> tuple[int, list[str]]:
    """The nodes of a schema, and its references (each time it makes one), iteratively."""
    count = 0
    refs: list[str] = []
    stack = [root]
    while stack:
        node = stack.pop()
        count += 1
        if node.ref is not None:
            refs.append(node.ref)
        stack.extend(node.children())
    return count, refs


def dump_schema(schema: SchemaNode) -> dict[str, Any]:
    """The schema as the client wrote it (by alias, only what was set: `const: null`
    stays), for llama-server's body."""
    dumped: dict[str, Any] = schema.model_dump(by_alias=True, exclude_unset=True)
    return dumped
