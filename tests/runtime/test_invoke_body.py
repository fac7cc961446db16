"""llama-server's request for an invoke is built from InvokeParams only
(agent/runtime/invoke.py: llama_body): no key outside the list ever appears, the token
bound stays within the worker's ceiling, and what was not set is left out."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.runtime.invoke import llama_body
from schemas.gateway import InvokeParams

pytestmark = pytest.mark.fast

ALLOWED = {
    "model", "messages", "max_tokens", "temperature", "top_p", "seed", "presence_penalty",
    "frequency_penalty", "stop", "stream", "stream_options",
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
