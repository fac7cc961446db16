"""Issue 34's chat fields end to end, all real: the official `openai` client through the
control plane's gateway to a runtime worker and llama-server with the small model
(SmolLM2-135M-Instruct). Its answers are not meaningful; the tests assert on what
llama-server's grammar and the wire guarantee, and say which:

* structured output: the JSON Schema of a Pydantic model is compiled into a grammar, so
  an answer that ends by itself (`finish_reason == "stop"`) is valid for the model;
  one cut at `max_tokens` (the SDK raises LengthFinishReasonError) promises nothing, and
  is not checked for validity;
* log probabilities: each token comes with as many alternatives as asked.

* tool calls: SmolLM2's own template cannot render tools (design note §1.1), so their
  deployment's profile loads the shipped `chatml-tools` template. With `tool_choice`
  `required` or a named function, the runtime worker opens the call for the model (the
  prefill, agent/runtime/llama_body.py) and llama-server's grammar then holds it to a call
  of a tool it was given, its arguments valid JSON for that tool's parameters. Not
  guaranteed, and not asserted: `finish_reason == "tool_calls"` (the 135M model may
  call again until `max_tokens`: it was seen making two calls), exactly one call, what
  the arguments say, or that `auto` calls at all.

* completions and embeddings (one deployment serving all three endpoints, its profile
  pooling by mean): a completion's text is a string and its usage is reported (plain,
  streamed, a list of two prompts); an embedding of SmolLM2 has 576 dimensions and unit
  norm (llama-server normalises a pooled embedding), base64 and floats the same vector;
  the admin usage route counts both endpoints' tokens."""

from __future__ import annotations

import json
import math
from typing import Any

import jsonschema_rs  # comes with schemathesis (dev)
import openai
import pytest
from langchain_core.messages import AIMessage
from langchain_openai import ChatOpenAI, OpenAIEmbeddings
from pydantic import BaseModel, Field, SecretStr

from schemas.usage import USAGE
from tests.agent.harness import admin, wait_until
from tests.api_server import ApiFactory, RunningApi
from tests.runtime.probing import (
    MESSAGES,
    ProbeNode,
    deploy_model,
    deployed,
    gateway,
    gateway_client,
)
from tests.runtime_flows import create_profile

# The usage window flushed often: the rows are there within a second.
FLUSH_S = 0.2
# SmolLM2-135M's hidden size.
DIMENSIONS = 576


@pytest.fixture
def probe_api(api_factory: ApiFactory) -> RunningApi:
    """A plain answer's first frame is the whole answer: the gateway waits for it as
    long as the clients here do (a loaded 2-core box was seen past the default 60 s for
    48 tokens)."""
    return api_factory(job_lease_s=10, job_retry_base_s=0.2, gateway_measure_interval_s=FLUSH_S,
                       gateway_first_token_timeout_s=120)  # fmt: skip


class Person(BaseModel):
    """Bounded so a whole answer fits well inside max_tokens."""

    name: str = Field(max_length=16)
    age: int = Field(ge=0, le=120)


def test_structured_output_and_logprobs_through_the_openai_client(
    probe_node: ProbeNode,
) -> None:
    runtime, environment = probe_node.runtime()
    deployed(probe_node, environment)
    client = gateway_client(probe_node)
    asked: list[Any] = [{"role": "user", "content": "Invent a person: a name and an age."}]

    try:
        completion = client.chat.completions.parse(
            model="smol", messages=asked, response_format=Person, max_tokens=128, temperature=0
        )
    except openai.LengthFinishReasonError as cut:
        # Cut at max_tokens: the grammar promises nothing about a partial answer.
        assert cut.completion.choices[0].finish_reason == "length"
    else:
        choice = completion.choices[0]
        assert choice.finish_reason == "stop", runtime.output[-2000:]
        # Valid for the model: the SDK parsed it, and pydantic checks the bounds again.
        assert isinstance(choice.message.parsed, Person), choice.message.content
        Person.model_validate_json(choice.message.content or "")

    answer = client.chat.completions.create(
        model="smol", messages=asked, response_format={"type": "json_object"}, max_tokens=64,
        temperature=0,
    )  # fmt: skip
    if answer.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(answer.choices[0].message.content or ""), dict)

    answer = client.chat.completions.create(
        model="smol", messages=MESSAGES, max_tokens=4, temperature=0, logprobs=True,
        top_logprobs=2,
    )  # fmt: skip
    logprobs = answer.choices[0].logprobs
    assert logprobs is not None and logprobs.content, runtime.output[-2000:]
    for token in logprobs.content:
        assert len(token.top_logprobs) == 2
        assert token.logprob <= 0

    with pytest.raises(openai.UnprocessableEntityError) as refused:
        client.chat.completions.create(
            model="smol", messages=MESSAGES, max_tokens=4, logprobs=True, top_logprobs=21
        )
    assert refused.value.body["param"] == "top_logprobs"  # type: ignore[index]


WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24},
                   "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}  # fmt: skip
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER,
     "description": "The weather in a city."}},
    {"type": "function", "function": {"name": "get_time", "description": "The time in a city.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                    "required": ["city"]}}},
]  # fmt: skip
PARAMETERS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
ASKED: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED: Any = {"type": "function", "function": {"name": "get_weather"}}


def _valid_calls(calls: list[tuple[str, str, str]], cut: bool, names: set[str]) -> None:
    """(id, name, arguments) of each call: a tool given, arguments valid for its
    parameters. The last call of an answer cut at max_tokens may be partial: only its
    id and name are checked."""
    assert calls, "no tool call"
    for index, (call_id, name, arguments) in enumerate(calls):
        assert call_id, calls
        assert name in names, calls
        if cut and index == len(calls) - 1:
            continue
        jsonschema_rs.validate(PARAMETERS[name], json.loads(arguments))


def _streamed_calls(chunks: list[Any]) -> tuple[list[tuple[str, str, str]], bool, str]:
    """The calls reassembled from a stream's deltas (by index), whether it was cut at
    max_tokens, and the text it streamed."""
    calls: dict[int, list[str]] = {}
    cut, text = False, ""
    for chunk in chunks:
        for choice in chunk.choices:
            cut = cut or choice.finish_reason == "length"
            text += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, ["", "", ""])
                call[0] += delta.id or ""
                if delta.function is not None:
                    call[1] += delta.function.name or ""
                    call[2] += delta.function.arguments or ""
    return [(c[0], c[1], c[2]) for _, c in sorted(calls.items())], cut, text


def test_tool_calls_plain_streamed_and_answered_through_the_openai_client(
    probe_node: ProbeNode,
) -> None:
    """`required` plain, and a named function plain and streamed (the node sends the named
    form as `required` with that tool alone, so a stream of `required` is the same to
    llama-server). 48 tokens hold one whole call (about 40); a second call, which the
    model often starts, is then cut."""
    runtime, environment = probe_node.runtime()
    with probe_node.api.client() as http:
        profile = create_profile(http, probe_node.api, "tools-small", ctx_size=1024,
                                 threads=2, chat_template="chatml-tools")  # fmt: skip
    deploy_model(probe_node.api, probe_node.node_id, environment, profile["id"])
    # A shared 2-core CI box was seen at 0.6 s a token: 48 of them fit in 120 s.
    client = gateway_client(probe_node).with_options(timeout=120)
    asked: dict[str, Any] = {"model": "smol", "messages": ASKED, "tools": TOOLS,
                             "max_tokens": 48, "temperature": 0}  # fmt: skip

    choices: list[tuple[Any, set[str]]] = [("required", set(PARAMETERS)), (NAMED, {"get_weather"})]
    for choice, names in choices:
        answer = client.chat.completions.create(**asked, tool_choice=choice)
        message = answer.choices[0].message
        calls = [(c.id, c.function.name, c.function.arguments)
                 for c in message.tool_calls or [] if c.type == "function"]  # fmt: skip
        _valid_calls(calls, answer.choices[0].finish_reason == "length", names)
        assert not message.content, message  # the call is the answer: null or ""

    stream = client.chat.completions.create(
        **asked, tool_choice=NAMED, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    streamed, cut, text = _streamed_calls(chunks)
    _valid_calls(streamed, cut, {"get_weather"})
    assert not text, text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0

    # The round trip: the call and the tool's answer sent back; the model answers in text.
    first = message.tool_calls[0] if message.tool_calls else None
    assert first is not None and first.type == "function"
    history: list[Any] = [
        *ASKED,
        {"role": "assistant", "content": None, "tool_calls": [first.model_dump()]},
        {"role": "tool", "tool_call_id": first.id, "content": '{"celsius": 21, "sky": "clear"}'},
    ]
    answer = client.chat.completions.create(
        model="smol", messages=history, max_tokens=16, temperature=0
    )
    assert answer.choices[0].message.content, runtime.output[-2000:]
    assert answer.usage is not None and answer.usage.prompt_tokens > 0

    _through_langchain(client)


class GetWeather(BaseModel):
    """The weather in a city."""

    city: str = Field(max_length=24)


def _through_langchain(client: openai.OpenAI) -> None:
    """LangChain's ChatOpenAI on the same deployment: `bind_tools` with a named choice and
    `with_structured_output` by function calling (both send the named form, design note
    §1.1) and by JSON schema, and a stream with its usage. Grammar guarantees as above:
    LangChain parses the first call's arguments into the model, or the SDK raises for an
    answer cut at max_tokens."""
    llm = ChatOpenAI(model="smol", base_url=str(client.base_url), api_key=client.api_key,
                     max_tokens=48, temperature=0, max_retries=0, timeout=120,
                     stream_usage=True)  # fmt: skip
    asked = [("user", "What is the weather in Paris?")]

    called = llm.bind_tools([GetWeather], tool_choice="GetWeather").invoke(asked)
    assert isinstance(called, AIMessage) and called.tool_calls, called
    for call in called.tool_calls:  # parsed whole; a call cut short is an invalid_tool_call
        assert call["name"] == "GetWeather" and call["id"], called
        GetWeather.model_validate(call["args"])

    person = llm.with_structured_output(Person, method="function_calling").invoke(
        [("user", "Invent a person: a name and an age.")]
    )
    assert isinstance(person, Person), person

    try:
        person = llm.with_structured_output(Person).invoke(
            [("user", "Invent a person: a name and an age.")]
        )
    except openai.LengthFinishReasonError:
        pass  # cut at max_tokens: the grammar promises nothing about a partial answer
    else:
        assert isinstance(person, Person), person

    chunks = list(llm.stream([("user", "Say hello.")], max_tokens=8))
    assert all(isinstance(chunk.content, str) for chunk in chunks)
    usage = [chunk.usage_metadata for chunk in chunks if chunk.usage_metadata]
    assert usage and usage[-1]["output_tokens"] > 0, chunks


def _unit(vector: list[float]) -> None:
    assert len(vector) == DIMENSIONS
    assert abs(math.sqrt(sum(x * x for x in vector)) - 1) <= 1e-3


def test_completions_and_embeddings_through_the_openai_client_and_langchain(
    probe_node: ProbeNode,
) -> None:
    runtime, environment = probe_node.runtime()
    with probe_node.api.client() as http:
        profile = create_profile(http, probe_node.api, "all-endpoints", ctx_size=2048,
                                 threads=2, server_args={"pooling": "mean"})  # fmt: skip
    deploy_model(probe_node.api, probe_node.node_id, environment, profile["id"],
                 endpoints=["chat", "completions", "embeddings"])  # fmt: skip
    client, _ = gateway(probe_node.api, name="endpoints")
    client = client.with_options(timeout=120)
    listed = {model.id: model.model_dump() for model in client.models.list()}
    assert listed["smol"]["endpoints"] == ["chat", "completions", "embeddings"]

    plain = client.completions.create(model="smol", prompt="Once upon a time", max_tokens=8,
                                      temperature=0)  # fmt: skip
    assert isinstance(plain.choices[0].text, str) and plain.choices[0].text, runtime.output[-2000:]
    assert plain.usage is not None and plain.usage.completion_tokens > 0

    # The usage rides on the final choice's event, asked for or not.
    chunks = list(client.completions.create(model="smol", prompt="Once upon a time",
                                            max_tokens=8, temperature=0, stream=True))  # fmt: skip
    assert "".join(c.text for chunk in chunks for c in chunk.choices) == plain.choices[0].text
    streamed = [chunk.usage for chunk in chunks if chunk.usage]
    assert streamed and streamed[-1].completion_tokens == plain.usage.completion_tokens

    two = client.completions.create(model="smol", prompt=["Once upon a time", "Hello"],
                                    max_tokens=4, temperature=0)  # fmt: skip
    assert sorted(choice.index for choice in two.choices) == [0, 1]
    assert all(isinstance(choice.text, str) for choice in two.choices)
    assert two.usage is not None and two.usage.prompt_tokens > 0

    texts = ["The cat sat on the mat.", "Paris is in France."]
    base64 = client.embeddings.create(model="smol", input=texts)  # the SDK asks base64
    floats = client.embeddings.create(model="smol", input=texts, encoding_format="float")
    assert [item.index for item in floats.data] == [0, 1]
    for encoded, plain_vector in zip(base64.data, floats.data, strict=True):
        _unit(plain_vector.embedding)
        assert all(abs(a - b) <= 1e-6 for a, b in
                   zip(encoded.embedding, plain_vector.embedding, strict=True))  # fmt: skip
    assert floats.usage.prompt_tokens > 0

    with pytest.raises(openai.UnprocessableEntityError) as refused:
        client.embeddings.create(model="smol", input=texts, dimensions=8)
    assert refused.value.body["param"] == "dimensions"  # type: ignore[index]
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        client.completions.create(model="smol", prompt="x", max_tokens=2, echo=True)
    assert refused.value.body["param"] == "echo"  # type: ignore[index]

    # LangChain: its embeddings without tiktoken's token ids (tests have no network for
    # tiktoken's files, and the gateway refuses token ids); its chat model streaming.
    embedder = OpenAIEmbeddings(
        model="smol", openai_api_base=str(client.base_url),
        openai_api_key=SecretStr(client.api_key),
        check_embedding_ctx_length=False, max_retries=0, request_timeout=120,
    )  # fmt: skip
    vectors = embedder.embed_documents(texts)
    assert len(vectors) == 2
    for vector, expected in zip(vectors, floats.data, strict=True):
        _unit(vector)
        assert all(abs(a - b) <= 1e-6 for a, b in zip(vector, expected.embedding, strict=True))
    _unit(embedder.embed_query("Hello"))
    llm = ChatOpenAI(model="smol", base_url=str(client.base_url), api_key=client.api_key,
                     max_tokens=8, temperature=0, max_retries=0, timeout=120,
                     stream_usage=True)  # fmt: skip
    said = list(llm.stream([("user", "Say hello.")]))
    usage = [chunk.usage_metadata for chunk in said if chunk.usage_metadata]
    assert usage and usage[-1]["output_tokens"] > 0, said

    # Every request counted once, with the tokens llama-server reported for each: 3
    # completions, 4 embeddings (base64, floats, LangChain's documents and query), 1 chat
    # stream; the 422s never became invokes and are not metered.
    requests = 8
    completion = (plain.usage.completion_tokens + streamed[-1].completion_tokens
                  + two.usage.completion_tokens + usage[-1]["output_tokens"])  # fmt: skip
    prompt = (plain.usage.prompt_tokens + streamed[-1].prompt_tokens + two.usage.prompt_tokens
              + usage[-1]["input_tokens"] + 3 * floats.usage.prompt_tokens)  # fmt: skip

    def counted() -> dict[str, Any] | None:
        report = admin(probe_node.api, "GET", USAGE, params={"step": "day"})
        return report if report["totals"]["requests"] >= requests else None

    totals = wait_until(counted, 20, f"{requests} requests in the usage rollup")["totals"]
    assert totals["requests"] == requests and totals["errors"] == {}
    # Embeddings' tokens are input tokens (the query's count is not shown to its caller);
    # they complete nothing.
    assert totals["prompt_tokens"] > prompt
    assert totals["completion_tokens"] == completion
