"""Issue 34's hostile values POSTed for real to the gateway: each is refused 422 in
OpenAI's envelope, naming the field, before any route is chosen, so nothing reaches a
node (no delivery is attempted). The values clients send pass the validation (here the
deployment's template calls no tools, so the answer is 422 tools_unsupported)."""

from __future__ import annotations

from typing import Any

from schemas.protocol import GATEWAY_CHAT_COMPLETIONS
from tests.api_processes import samples
from tests.api_server import RunningApi
from tests.deployment_flows import ready_deployment, service_client
from tests.test_gateway_errors import envelope

CHAT: dict[str, Any] = {"model": "smol", "messages": [{"role": "user", "content": "hi"}]}


def _tool(name: str = "f", **function: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, **function}}


def _deep(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema}
    return {"type": "object", "properties": {"x": schema}}


LOOP = {"type": "object", "$defs": {"A": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"}
HOSTILE: list[tuple[dict[str, Any], str]] = [
    ({"tools": [_tool("a/b")]}, "tools.0.function.name"),
    ({"tools": [_tool(description="x" * 1_000_000)]}, "tools.0.function.description"),
    ({"tools": [_tool(parameters=_deep(40))]}, "tools.0.function.parameters"),
    ({"tools": [_tool(parameters=LOOP)]}, "tools.0.function.parameters"),
    ({"tools": [_tool(parameters={"type": "object", "if": {}})]},
     "tools.0.function.parameters.if"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"logit_bias": {"1": 5}}, "logit_bias"),
]  # fmt: skip


KIDS = {"kids": {"type": "array", "items": {"$ref": "#/$defs/N"}}}
CYCLE = {
    "type": "object",
    "properties": KIDS,
    "$defs": {"N": {"type": "object", "properties": {"kids": {"$ref": "#/$defs/N"}}}},
}
NAMED: list[tuple[dict[str, Any], str, str]] = [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": CYCLE}}},
     "response_format.json_schema.schema", "cycle"),
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "n", "schema": {"type": "object", "if": {}}}}},
     "response_format.json_schema.schema.if", "Extra inputs"),
    ({"messages": [{"role": "assistant", "content": "a", "tool_calls": [{"id": "c"}]}]},
     "messages.0.tool_calls.0.type", "required"),
]  # fmt: skip


def _attempts(client: Any) -> float:
    return sum(
        value
        for (name, _), value in samples(client).items()
        if name == "modelforge_gateway_attempts_total"
    )


def test_hostile_values_are_refused_422_and_reach_no_node(api: RunningApi) -> None:
    with api.client() as client:
        ready_deployment(client, api)
        auth = {"Authorization": f"Bearer {service_client(client, api)}"}
        before = _attempts(client)
        for fields, param in HOSTILE:
            refused = client.post(GATEWAY_CHAT_COMPLETIONS, json={**CHAT, **fields}, headers=auth)
            assert envelope(refused, 422, "validation_failed")["param"].startswith(param)
        # Named as the client wrote it: no union tag or branch in `param`, and the
        # message says what is wrong there (instructor shows only `error.message`).
        for fields, param, why in NAMED:
            refused = client.post(GATEWAY_CHAT_COMPLETIONS, json={**CHAT, **fields}, headers=auth)
            error = envelope(refused, 422, "validation_failed")
            assert error["param"] == param, error
            assert error["message"].startswith(f"{param}: ") and why in error["message"], error
        # 10,000 deep: the body does not even decode (Python's json gives up first).
        nested = '{"items":' * 10_000 + "{}" + "}" * 10_000
        tool = '{"type":"function","function":{"name":"f","parameters":' + nested + "}}"
        body = '{"model":"smol","messages":[{"role":"user","content":"hi"}],"tools":['
        unparseable = client.post(
            GATEWAY_CHAT_COMPLETIONS,
            content=(body + tool + "]}").encode(),
            headers={**auth, "Content-Type": "application/json"},
        )
        envelope(unparseable, 422, "body_unparseable")
        assert _attempts(client) == before
        accepted = client.post(
            GATEWAY_CHAT_COMPLETIONS,
            json={**CHAT, "tools": [_tool(parameters={"type": "object"})],
                  "tool_choice": "required", "logprobs": True, "top_logprobs": 2},
            headers=auth,
        )  # fmt: skip
        # Valid: refused only past validation, since this deployment's chat template
        # calls no tools (tests/test_gateway_endpoints_http.py routes one that does).
        assert envelope(accepted, 422, "tools_unsupported")["param"] == "tools"
