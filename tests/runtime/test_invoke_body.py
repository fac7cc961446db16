"""llama-server's request for an invoke is built from its typed params only
(agent/runtime/llama_body.py): no key outside the list ever appears, the token
bound stays within the worker's ceiling, and what was not set is left out; chat,
completions and embeddings each go to their own path. A whole completion for a list
of prompts is asked one prompt at a time: the answers merge into one completion
(agent/runtime/completion_list.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.runtime.completion_list import BrokenAnswer, listed_prompts, merge, parse
from agent.runtime.llama_body import (
    completion_body,
    embedding_body,
    endpoint_of,
    llama_body,
    llama_request,
)
from schemas.gateway import InvokeParams
from schemas.gateway_endpoints import CompletionParams, EmbeddingParams
from schemas.runtime_local import LOCAL_CHAT_COMPLETIONS, LOCAL_COMPLETIONS, LOCAL_EMBEDDINGS

pytestmark = pytest.mark.fast

ALLOWED = {
    "model", "messages", "max_tokens", "temperature", "top_p", "seed", "presence_penalty",
    "frequency_penalty", "stop", "stream", "stream_options", "tools", "tool_choice",
    "parallel_tool_calls", "response_format", "logprobs", "top_logprobs",
}  # fmt: skip
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


def test_every_set_value_is_passed_on_under_its_own_key() -> None:
    params = InvokeParams.model_validate(
        {"messages": MESSAGES, "max_tokens": 64, "temperature": 0.5, "top_p": 0.9, "seed": 7,
         "presence_penalty": 0.1, "frequency_penalty": -0.2, "stop": ["\n\n"], "stream": True,
         "include_usage": True}
    )  # fmt: skip
    body = llama_body(params, "served-name", ceiling=8192)
    assert body == {
        "model": "served-name", "messages": MESSAGES, "max_tokens": 64, "temperature": 0.5,
        "top_p": 0.9, "seed": 7, "presence_penalty": 0.1, "frequency_penalty": -0.2,
        "stop": ["\n\n"], "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip


def test_unset_values_are_left_out_and_the_bound_is_the_ceiling_at_most() -> None:
    params = InvokeParams.model_validate({"messages": MESSAGES, "max_tokens": 4000})
    body = llama_body(params, "m", ceiling=256)
    assert body == {"model": "m", "messages": MESSAGES, "max_tokens": 256, "stream": False}
    # Usage is asked for a stream only (llama-server reports it in the last chunk).
    asked = InvokeParams.model_validate({"messages": MESSAGES, "max_tokens": 1,
                                         "include_usage": True})  # fmt: skip
    assert "stream_options" not in llama_body(asked, "m", ceiling=256)


params_strategy = st.builds(
    InvokeParams,
    messages=st.lists(
        st.builds(dict, role=st.sampled_from(["system", "user", "assistant"]),
                  content=st.text(max_size=40)),
        min_size=1, max_size=4,
    ),
    max_tokens=st.integers(1, 8192),
    temperature=st.none() | st.floats(0, 2),
    top_p=st.none() | st.floats(0, 1),
    seed=st.none() | st.integers(0, 2**31 - 1),
    stop=st.lists(st.text(min_size=1, max_size=8), max_size=4),
    stream=st.booleans(),
    include_usage=st.booleans(),
)  # fmt: skip


@given(params=params_strategy, ceiling=st.integers(1, 10_000))
def test_no_key_outside_the_list_and_the_bound_always_holds(
    params: InvokeParams, ceiling: int
) -> None:
    body = llama_body(params, "m", ceiling)
    assert set(body) <= ALLOWED
    assert 1 <= body["max_tokens"] <= min(ceiling, params.max_tokens)
    assert all(set(message) == {"role", "content"} for message in body["messages"])


# Issue 34's fields: how each reaches llama-server (docs/design/gateway-openai-breadth.md §3.4).


def _tool(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": f"Does {name}.",
            "parameters": {"type": "object", "properties": {"x": {"const": None}}},
            "strict": True}}  # fmt: skip


def _body(**fields: Any) -> dict[str, Any]:
    params = InvokeParams.model_validate_json(
        json.dumps({"messages": MESSAGES, "max_tokens": 8, **fields})
    )
    return llama_body(params, "m", ceiling=64)


def test_a_named_tool_choice_sends_that_tool_alone_and_requires_one_call() -> None:
    """llama-server reads tool_choice as a string only: the named form would become auto."""
    body = _body(tools=[_tool("a"), _tool("b")],
                 tool_choice={"type": "function", "function": {"name": "b"}})  # fmt: skip
    sent_b = {"type": "function", "function": {"name": "b", "description": "Does b.",
              "parameters": {"type": "object", "properties": {"x": {"const": None}}}}}  # fmt: skip
    assert body["tools"] == [sent_b]  # the schema as written (`const: null`), no `strict`
    assert (body["tool_choice"], body["parallel_tool_calls"]) == ("required", False)


def test_tool_choice_none_sends_no_tools_and_the_others_pass_as_they_are() -> None:
    assert not {"tools", "tool_choice"} & set(_body(tools=[_tool("a")], tool_choice="none"))
    body = _body(tools=[_tool("a")], tool_choice="auto", parallel_tool_calls=True)
    assert (body["tool_choice"], body["parallel_tool_calls"]) == ("auto", True)
    assert not {"tool_choice", "parallel_tool_calls"} & set(_body(tools=[_tool("a")]))


def test_logprobs_without_top_logprobs_asks_for_none() -> None:
    """llama-server's default would be 20 alternatives per token."""
    assert (_body(logprobs=True)["logprobs"], _body(logprobs=True)["top_logprobs"]) == (True, 0)
    assert _body(logprobs=True, top_logprobs=2)["top_logprobs"] == 2
    assert not {"logprobs", "top_logprobs"} & set(_body(logprobs=False))


def test_response_formats_map_to_llamas_and_the_schema_goes_as_written() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}},
              "required": ["n"], "$defs": {"D": {"const": None}}}  # fmt: skip
    wanted = {"type": "json_schema", "json_schema": {"name": "N", "strict": True, "schema": schema}}
    body = _body(response_format=wanted)
    assert body["response_format"] == {"type": "json_schema", "json_schema": {"schema": schema}}
    no_schema = {"type": "json_schema", "json_schema": {"name": "N"}}
    assert _body(response_format=no_schema)["response_format"] == {"type": "json_object"}
    assert _body(response_format={"type": "json_object"})["response_format"] == {
        "type": "json_object"
    }
    assert "response_format" not in _body(response_format={"type": "text"})


def test_roles_developer_as_system_and_tool_calls_carried() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "a", "arguments": "{}"}}
    body = _body(messages=[
        {"role": "developer", "content": "Be brief.", "name": "ops"},
        {"role": "user", "content": "Hi", "name": "ann"},
        {"role": "assistant", "content": None, "tool_calls": [call], "refusal": None},
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
    ])  # fmt: skip
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
    ]


OPENING = {"role": "assistant", "content": "<tool_call>\n"}


def _on(template: Any, **fields: Any) -> dict[str, Any]:
    params = InvokeParams.model_validate_json(
        json.dumps({"messages": MESSAGES, "max_tokens": 8, **fields})
    )
    return llama_body(params, "m", ceiling=64, template=template)


def test_a_required_call_on_the_shipped_template_is_opened_for_the_model() -> None:
    """`required` only constrains how an answer ends (design note §1.1): the prefill puts
    the grammar inside the call at once, on the template whose marker we know."""
    named = {"type": "function", "function": {"name": "a"}}
    for choice in ("required", named):
        body = _on("chatml-tools", tools=[_tool("a")], tool_choice=choice)
        assert body["messages"] == [*MESSAGES, OPENING]
        assert body["tool_choice"] == "required"


def test_no_prefill_where_no_call_is_required_or_the_marker_is_not_ours() -> None:
    for fields in ({"tools": [_tool("a")]}, {"tools": [_tool("a")], "tool_choice": "auto"},
                   {"tools": [_tool("a")], "tool_choice": "none"}, {}):  # fmt: skip
        assert _on("chatml-tools", **fields)["messages"] == MESSAGES, fields
    # The model's own template: its call marker is unknown.
    assert _on("model", tools=[_tool("a")], tool_choice="required")["messages"] == MESSAGES
    assert _body(tools=[_tool("a")], tool_choice="required")["messages"] == MESSAGES


def test_a_conversation_ending_with_an_assistant_message_is_not_opened_again() -> None:
    """The client's own prefill (or a partial answer it asks to continue) is kept as is."""
    mine = {"role": "assistant", "content": "<tool_call>\n{"}
    body = _on("chatml-tools", messages=[*MESSAGES, mine], tools=[_tool("a")],
               tool_choice="required")  # fmt: skip
    assert body["messages"] == [*MESSAGES, mine]
    call = {"id": "c1", "type": "function", "function": {"name": "a", "arguments": "{}"}}
    answered = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "content": "42", "tool_call_id": "c1"}]  # fmt: skip
    body = _on("chatml-tools", messages=answered, tools=[_tool("a")], tool_choice="required")
    assert body["messages"][-1] == OPENING  # after a tool's answer, the next call is opened


# The other endpoints (design §2.4, §3.4): the path by the params' kind, typed fields only.

COMPLETION_KEYS = {
    "model", "prompt", "max_tokens", "temperature", "top_p", "seed", "presence_penalty",
    "frequency_penalty", "stop", "stream", "stream_options",
}  # fmt: skip


def _completion(**fields: Any) -> CompletionParams:
    return CompletionParams.model_validate_json(
        json.dumps({"endpoint": "completions", "prompt": "Once", "max_tokens": 8, **fields})
    )


def test_a_completion_passes_the_prompt_and_what_was_set() -> None:
    plain = _completion(max_tokens=4000)
    assert llama_request(plain, "smol", ceiling=256) == (
        LOCAL_COMPLETIONS,
        {"model": "smol", "prompt": "Once", "max_tokens": 256, "stream": False},
    )
    streamed = _completion(temperature=0.5, top_p=0.9, seed=7, presence_penalty=0.1,
                           frequency_penalty=-0.2, stop=["\n"], stream=True,
                           include_usage=True)  # fmt: skip
    assert completion_body(streamed, "smol", ceiling=64) == {
        "model": "smol", "prompt": "Once", "max_tokens": 8, "temperature": 0.5, "top_p": 0.9,
        "seed": 7, "presence_penalty": 0.1, "frequency_penalty": -0.2, "stop": ["\n"],
        "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    # A list prompt goes as a list (llama answers one choice per prompt).
    listed = _completion(prompt=["Once", "Twice"])
    assert completion_body(listed, "smol", ceiling=64)["prompt"] == ["Once", "Twice"]
    # Usage is asked for a stream only.
    assert "stream_options" not in completion_body(_completion(include_usage=True), "m", 64)


def test_embeddings_pass_the_inputs_and_their_encoding_only() -> None:
    for encoding in ("float", "base64"):
        params = EmbeddingParams.model_validate_json(json.dumps(
            {"endpoint": "embeddings", "input": ["a", "b"], "encoding_format": encoding}
        ))  # fmt: skip
        path, body = llama_request(params, "smol", ceiling=64)
        assert (path, body) == (
            LOCAL_EMBEDDINGS,
            {"model": "smol", "input": ["a", "b"], "encoding_format": encoding},
        )
        assert body == embedding_body(params, "smol")


def test_chat_goes_to_chat_completions_and_each_kind_names_its_endpoint() -> None:
    chat = InvokeParams.model_validate({"messages": MESSAGES, "max_tokens": 8})
    assert llama_request(chat, "m", 64) == (LOCAL_CHAT_COMPLETIONS, llama_body(chat, "m", 64))
    embed = EmbeddingParams.model_validate({"input": ["a"]})
    assert [endpoint_of(p) for p in (chat, _completion(), embed)] == [
        "chat", "completions", "embeddings",
    ]  # fmt: skip


completion_strategy = st.builds(
    CompletionParams,
    prompt=st.text(max_size=40) | st.lists(st.text(max_size=20), min_size=1, max_size=16),
    max_tokens=st.integers(1, 8192),
    temperature=st.none() | st.floats(0, 2),
    top_p=st.none() | st.floats(0, 1),
    seed=st.none() | st.integers(0, 2**31 - 1),
    stop=st.lists(st.text(min_size=1, max_size=8), max_size=4),
    stream=st.just(False),
    include_usage=st.booleans(),
)


@given(params=completion_strategy, ceiling=st.integers(1, 10_000))
def test_a_completion_has_no_key_outside_its_list_and_the_bound_holds(
    params: CompletionParams, ceiling: int
) -> None:
    path, body = llama_request(params, "m", ceiling)
    assert path == LOCAL_COMPLETIONS and set(body) <= COMPLETION_KEYS
    assert 1 <= body["max_tokens"] <= min(ceiling, params.max_tokens)


def _one(text: str, prompt_tokens: int, completion_tokens: int, **extra: Any) -> bytes:
    """One prompt's answer as the pinned llama-server writes it."""
    return json.dumps({
        "id": f"cmpl-{text}", "object": "text_completion", "created": 1700000000 + len(text),
        "model": "smol", "system_fingerprint": "b1-x",
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
        **extra,
    }).encode()  # fmt: skip


def test_a_list_of_answers_merges_into_one_completion_in_prompt_order() -> None:
    answers = [parse(_one("a", 4, 2, timings={"n": 1})), parse(_one("bb", 5, 3))]
    merged = merge(answers)
    assert merged == {
        "id": "cmpl-a", "object": "text_completion", "created": 1700000001, "model": "smol",
        "system_fingerprint": "b1-x",
        "choices": [
            {"index": 0, "text": "a", "logprobs": None, "finish_reason": "length"},
            {"index": 1, "text": "bb", "logprobs": None, "finish_reason": "length"},
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14},
    }  # fmt: skip


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[]",
        json.dumps({**json.loads(_one("a", 1, 1)), "object": "chat.completion"}).encode(),
        json.dumps({**json.loads(_one("a", 1, 1)), "choices": []}).encode(),
        json.dumps({**json.loads(_one("a", 1, 1)), "usage": {"prompt_tokens": -1}}).encode(),
        _one("a", 1, 2**40),
        _one("a", 1, 1).replace(b'"choices": [', b'"choices": [{"index": 1, "text": "b"}, '),
    ],
)
def test_an_answer_that_is_not_a_one_choice_completion_is_broken(raw: bytes) -> None:
    with pytest.raises(BrokenAnswer):
        parse(raw)


def test_only_a_whole_completion_of_two_prompts_or_more_is_asked_one_by_one() -> None:
    assert listed_prompts(_completion(prompt=["a", "b"])) == ["a", "b"]
    assert listed_prompts(_completion(prompt=["a"])) is None  # sent as it is
    assert listed_prompts(_completion(prompt="a")) is None
    assert listed_prompts(_completion(prompt=["a"], stream=True)) is None
    chat = InvokeParams.model_validate({"messages": MESSAGES, "max_tokens": 8})
    assert listed_prompts(chat) is None
    assert listed_prompts(EmbeddingParams.model_validate({"input": ["a", "b"]})) is None
