"""Issue 34's structured output through `instructor`, a client no one here wrote, all real:
`instructor.from_openai` in `Mode.JSON_SCHEMA` with `max_retries=0`, through the control
plane's gateway to a runtime worker and llama-server with the small model
(SmolLM2-135M-Instruct).

`Mode.JSON_SCHEMA` sends the Pydantic model's `model_json_schema()` as it is (design note
§1.5): `title` on every node, `default`, `description`, the nested model and the enum under
`$defs` with `$ref`, `anyOf` with `null` for an optional field, and no `strict`. The
gateway takes it (schemas/json_schema.py), the node re-validates it, and llama-server
compiles it into a grammar.

What the grammar guarantees, and is asserted: an answer that ends by itself
(`finish_reason == "stop"`) is JSON valid for the schema, so instructor parses it on its
only attempt (`max_retries=0`: a ValidationError would fail the test, never be re-asked);
the same text also validates against the schema that was sent (jsonschema_rs, not pydantic).
An answer cut at `max_tokens` promises nothing: instructor raises IncompleteOutputException
and nothing is checked. What a 135M model cannot give, and is not asserted: meaningful
values (a plausible name, an age that fits the prompt, which optional fields it fills)."""

from __future__ import annotations

import json
from typing import Any, Literal

import instructor
import jsonschema_rs  # comes with schemathesis (dev)
from instructor.core.exceptions import IncompleteOutputException
from openai.types.chat import ChatCompletion
from pydantic import BaseModel, Field

from tests.runtime.probing import ProbeNode, deployed, gateway_client


class City(BaseModel):
    """A city (a nested model: pydantic puts it under `$defs`)."""

    name: str = Field(max_length=16, description="The city's name.")


class Person(BaseModel):
    """A person. Every bound keeps a whole answer well inside max_tokens."""

    name: str = Field(max_length=16)
    age: int = Field(ge=0, le=120)
    mood: Literal["happy", "sad"] = "happy"
    home: City
    nickname: str | None = Field(default=None, max_length=8)


def test_instructor_json_schema_mode_through_the_gateway(probe_node: ProbeNode) -> None:
    runtime, environment = probe_node.runtime()
    deployed(probe_node, environment)
    # A shared 2-core CI box was seen at 0.6 s a token: 128 of them fit in 180 s.
    client = instructor.from_openai(
        gateway_client(probe_node).with_options(timeout=180), mode=instructor.Mode.JSON_SCHEMA
    )
    sent: list[dict[str, Any]] = []
    client.on("completion:kwargs", lambda *_, **kwargs: sent.append(kwargs))

    try:
        person, completion = client.create_with_completion(
            model="smol",
            messages=[{"role": "user", "content": "Invent a person: name, age, home city."}],
            response_model=Person,
            max_retries=0,
            max_tokens=128,
            temperature=0,
        )
    except IncompleteOutputException as cut:
        # Cut at max_tokens: the grammar promises nothing about a partial answer.
        assert isinstance(cut.last_completion, ChatCompletion), cut
        assert cut.last_completion.choices[0].finish_reason == "length"
        person, completion = None, None

    # What instructor sent is the raw pydantic schema (one attempt), and the gateway took it.
    assert len(sent) == 1, sent
    asked = sent[0]["response_format"]["json_schema"]
    assert asked["schema"] == Person.model_json_schema() and "strict" not in asked, asked
    assert {"$defs", "title"} <= set(asked["schema"]), asked
    if completion is None:
        return

    assert isinstance(completion, ChatCompletion)
    choice = completion.choices[0]
    assert choice.finish_reason == "stop", runtime.output[-2000:]
    assert isinstance(person, Person), choice.message.content
    jsonschema_rs.validate(asked["schema"], json.loads(choice.message.content or ""))
    assert completion.usage is not None and completion.usage.completion_tokens > 0
