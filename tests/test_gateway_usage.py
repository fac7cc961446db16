"""The gateway's usage per service client, served model and outcome (api/gateway/
usage.py, api/gateway/tally.py) against the real API and PostgreSQL, the test speaking
for the deployment's node over the protocol: every invoke lands in usage_minutes once,
whatever ended it (ok plain and streamed, a refusal, a node lost mid-stream, a client
that left), with the tokens the node reported (a stream's too, the usage event taken
out for a client that did not ask for it); two API processes add up; `/metrics` counts
per client and model. Then, without a database: a stream's usage read however its
chunks split it, a node's hostile usage ignored, and a failed flush that loses its
window, logged once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from api.gateway.scope import ClientScope
from api.gateway.tally import (
    TEMPLATE_TOKENS,
    TEMPLATE_TOKENS_PER_MESSAGE,
    StreamTally,
    bounded,
    chat_texts,
    plain_usage,
)
from api.gateway.usage import OUT_OF_SCOPE, GatewayUsage
from api.metrics import ApiMetrics
from schemas.gateway import ChatMessage
from schemas.protocol import GATEWAY_CHAT_COMPLETIONS
from store.engine import make_engine, make_sessionmaker
from tests.api_server import ApiFactory, RunningApi
from tests.deployment_flows import (
    answer_invoke,
    completion,
    created_service_client,
    ready_deployment,
    runtime_channel,
)
from tests.test_api_metrics import sample
from tests.usage_flows import CHAT, INTERVAL_S, call, gateway, rows_reach

# A stream as a node answers it, cut at odd places: the usage event of its own
# (`choices: []`) split over two chunks, one chunk holding the end of one event and
# the start of the next.
ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}\n\n'
USAGE_EVENT = b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n'
STREAM = [
    ROLE,
    b'data: {"choices":[{"index":0,"delta":{"content":"re"}}]}\n\ndata: {"choi',
    b'ces":[{"index":0,"delta":{"content":"ady"}}]}\n\n',
    b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n',
    USAGE_EVENT[:40],
    USAGE_EVENT[40:] + b"data: [DONE]\n\n",
]
WHOLE = b"".join(STREAM)
CONTENT = b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4) as executor:
        yield executor


@contextlib.contextmanager
def streamed(api: RunningApi, secret: str, **extra: Any) -> Iterator[httpx.Response]:
    with (
        httpx.Client(base_url=api.base_url, timeout=20) as client,
        client.stream("POST", GATEWAY_CHAT_COMPLETIONS, json={**CHAT, "stream": True, **extra},
                      headers={"Authorization": f"Bearer {secret}"}) as response,
    ):  # fmt: skip
        assert response.status_code == 200, response.read()
        yield response


def stream_lines(
    api: RunningApi, secret: str, opened: threading.Event | None = None, **extra: Any
) -> list[str]:
    """A stream's lines; `opened` is set once its answer began (its first chunk was in)."""
    with streamed(api, secret, **extra) as response:
        if opened is not None:
            opened.set()
        return [line for line in response.iter_lines() if line]


async def test_every_invoke_lands_once_per_client_model_and_outcome_with_its_tokens(
    api_factory: ApiFactory, sessions: async_sessionmaker[AsyncSession], pool: ThreadPoolExecutor
) -> None:
    api = gateway(api_factory)
    with api.client() as client:
        deployed = ready_deployment(client, api)
        alpha = created_service_client(client, api, name="alpha", models=["smol", "ghost"])
        beta = created_service_client(client, api, name="beta", rate_per_minute=1)
    node = deployed.node

    def answered(call_: Future[Any], body: bytes | list[bytes], stream: bool = False) -> Any:
        invoke = channel.next_invoke()
        kind = "text/event-stream" if stream else "application/json"
        sent = answer_invoke(api, node, invoke, body, content_type=kind)
        assert sent.status_code == 200, sent.text
        return invoke, call_.result(20)

    with runtime_channel(api, node) as channel:
        # Plain: the answer's usage.
        invoke, plain = answered(pool.submit(call, api, alpha["secret"]), completion("ready"))
        assert plain.status_code == 200 and invoke["params"]["include_usage"] is False
        # A stream whose client did not ask for usage: the node is asked all the same,
        # and its usage event does not reach the client.
        invoke, lines = answered(pool.submit(stream_lines, api, alpha["secret"]), STREAM, True)
        assert invoke["params"]["include_usage"] is True
        assert lines == [
            e.decode().strip() for e in WHOLE.split(b"\n\n") if e and b"usage" not in e
        ]
        # One that asked gets it.
        asked = {"stream_options": {"include_usage": True}}
        _, lines = answered(
            pool.submit(stream_lines, api, alpha["secret"], None, **asked), STREAM, True
        )
        assert lines[-2] == USAGE_EVENT.decode().strip() and lines[-1] == "data: [DONE]"
        # Outside its scope: refused, counted under no name the client chose.
        refused = call(api, alpha["secret"], {**CHAT, "model": "nobody-serves"})
        assert refused.status_code == 403
        # In its scope, served by no deployment.
        assert call(api, alpha["secret"], {**CHAT, "model": "ghost"}).status_code == 404
        # A node lost mid-stream: one content event relayed, counted as one token.
        opened = threading.Event()
        cut = pool.submit(stream_lines, api, alpha["secret"], opened)
        invoke = channel.next_invoke()

        def dies() -> Iterator[bytes]:
            yield ROLE + CONTENT
            # Once the stream is the client's (before, the gateway would retry it).
            assert opened.wait(20)
            raise ConnectionResetError("the node went away")

        with pytest.raises((httpx.HTTPError, ConnectionResetError)):
            answer_invoke(api, node, invoke, dies(), content_type="text/event-stream")
        assert json.loads(cut.result(20)[-1].removeprefix("data:"))["error"]["code"] == "node_lost"
        assert channel.wait_for("cancel")["invoke_id"] == invoke["invoke_id"]

        # A client that leaves once it read the content event.
        def leaves() -> str:
            with streamed(api, alpha["secret"]) as response:
                for line in response.iter_lines():
                    if '"a"' in line:
                        return line
            return ""

        left = pool.submit(leaves)
        invoke = channel.next_invoke()

        def slow() -> Iterator[bytes]:
            yield ROLE + CONTENT
            channel.wait_for("cancel")
            yield b"data: [DONE]\n\n"

        answer_invoke(api, node, invoke, slow(), content_type="text/event-stream")
        assert left.result(20).startswith("data:")
        # Another client: answered, then past its rate.
        _, ok = answered(pool.submit(call, api, beta["secret"]), completion("ready"))
        assert ok.status_code == 200
        assert call(api, beta["secret"]).status_code == 429

    a, b = alpha["id"], beta["id"]
    # completion(): 3 prompt and 1 completion tokens; the stream's usage: 5 and 2.
    await rows_reach(
        sessions,
        {
            (a, "smol", "ok"): (3, 3 + 5 + 5, 1 + 2 + 2, 2),
            (a, OUT_OF_SCOPE, "model_not_allowed"): (1, 0, 0, 0),
            (a, "ghost", "model_not_found"): (1, 0, 0, 0),
            (a, "smol", "node_lost"): (1, 0, 1, 1),
            (a, "smol", "client_left"): (1, 0, 1, 1),
            (b, "smol", "ok"): (1, 3, 1, 0),
            (b, "smol", "rate_limited"): (1, 0, 0, 0),
        },
    )
    with api.client() as client:
        text = client.get("/metrics").text
    requests, tokens = (
        "modelforge_gateway_client_requests_total",
        "modelforge_gateway_client_tokens_total",
    )
    assert sample(text, requests, client="alpha", model="smol", outcome="ok") == 3
    assert sample(text, requests, client="alpha", model="smol", outcome="client_left") == 1
    assert sample(text, requests, client="beta", model="smol", outcome="rate_limited") == 1
    assert sample(text, tokens, client="alpha", model="smol", kind="prompt") == 13
    assert sample(text, tokens, client="alpha", model="smol", kind="completion") == 7
    assert sample(text, tokens, client="beta", model="smol", kind="completion") == 1
    assert a not in text  # the client's name, never its id


async def test_two_api_processes_add_up(
    api_factory: ApiFactory, sessions: async_sessionmaker[AsyncSession], pool: ThreadPoolExecutor
) -> None:
    one, two = gateway(api_factory), gateway(api_factory)
    with one.client() as client:
        deployed = ready_deployment(client, one)
        app = created_service_client(client, one)
    by_gateway = {one.state.invokes.id: one, two.state.invokes.id: two}
    # The node's channel is held on the first; the second's invokes reach it over NATS.
    with runtime_channel(one, deployed.node) as channel:
        for api in (one, two, one, two, two):
            answer = pool.submit(call, api, app["secret"])
            invoke = channel.next_invoke()
            answer_invoke(by_gateway[invoke["gateway"]], deployed.node, invoke, completion())
            assert answer.result(20).status_code == 200
    await rows_reach(sessions, {(app["id"], "smol", "ok"): (5, 15, 5, 0)})


async def test_a_nodes_report_is_held_to_what_the_request_allows(
    api_factory: ApiFactory, sessions: async_sessionmaker[AsyncSession], pool: ThreadPoolExecutor
) -> None:
    """A node that inflates a client's usage counts at most the request's max_tokens and
    a token per byte of its messages (plus the template's); one that hides a stream's
    tokens counts the content events the client got; its own HTTP status is an outcome
    by class only (a metric label, bounded whatever the node sends)."""
    api = gateway(api_factory)
    with api.client() as client:
        deployed = ready_deployment(client, api)
        app = created_service_client(client, api, name="victim")
    node = deployed.node
    inflated = json.dumps({"choices": [], "usage": {
        "prompt_tokens": 9_999_999, "completion_tokens": 9_999_999}}).encode()  # fmt: skip
    hidden = USAGE_EVENT.replace(b"5", b"0").replace(b"2", b"0")
    with runtime_channel(api, node) as channel:
        answer = pool.submit(call, api, app["secret"])
        answer_invoke(api, node, channel.next_invoke(), inflated)
        assert answer.result(20).status_code == 200
        lines = pool.submit(stream_lines, api, app["secret"])
        answer_invoke(api, node, channel.next_invoke(), [ROLE + CONTENT + CONTENT + CONTENT,
                      hidden + b"data: [DONE]\n\n"], content_type="text/event-stream")  # fmt: skip
        assert lines.result(20)[-1] == "data: [DONE]"
        for status in (418, 499):
            answer = pool.submit(call, api, app["secret"])
            answer_invoke(api, node, channel.next_invoke(), b"{}", status=status)
            assert answer.result(20).status_code == 422
    prompt = TEMPLATE_TOKENS + TEMPLATE_TOKENS_PER_MESSAGE + len("hi")
    await rows_reach(
        sessions,
        {
            # CHAT asks for at most 4 tokens; the stream relayed three content events.
            (app["id"], "smol", "ok"): (2, prompt, 4 + 3, 1),
            (app["id"], "smol", "upstream_4xx"): (2, 0, 0, 0),
        },
    )


async def test_what_is_counted_while_the_last_flush_runs_is_flushed_too(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """The process stops while a flush is under way: what its invokes counted after that
    flush took its window is written by one more, not lost."""
    stop = asyncio.Event()
    scope = ClientScope(uuid.uuid4(), "app", frozenset({"smol"}), frozenset(), None, None)

    class StoppedDuringAFlush(GatewayUsage):
        async def flush(self) -> int:
            written = await super().flush()
            if not stop.is_set():
                # An invoke that ended while the flush was writing, then the stop.
                self.meter(scope, "smol").record("ok", 5, 2)
                stop.set()
            return written

    usage = StoppedDuringAFlush(sessions, 0.01, ApiMetrics())
    usage.meter(scope, "smol").record("ok", 3, 1)
    await asyncio.wait_for(usage.run(stop), 20)
    await rows_reach(sessions, {(str(scope.client_id), "smol", "ok"): (2, 8, 3, 0)})


# ---------------------------------------------------------------------- no database


@pytest.mark.fast
def test_a_report_is_bounded_by_the_request() -> None:
    messages = chat_texts([ChatMessage(role="user", content="hé")])  # 2 characters, 3 bytes
    ceiling = TEMPLATE_TOKENS + TEMPLATE_TOKENS_PER_MESSAGE + 3
    assert bounded((10, 3), messages, 8) == (10, 3)  # honest: as reported
    assert bounded((ceiling, 8), messages, 8) == (ceiling, 8)
    assert bounded((10**7, 10**7), messages, 8) == (ceiling, 8)
    # A completion's prompts bound it alike; embeddings complete nothing.
    assert bounded((10**7, 10**7), ["hé", "ab"], 8) == (ceiling + 32 + 2, 8)
    assert bounded((4, 9), ["hé"], 0) == (4, 0)
    # A stream that reports fewer completion tokens than the content events it relayed.
    tally = StreamTally(strip_usage=True)
    tally.feed(ROLE + CONTENT + CONTENT + USAGE_EVENT)
    assert tally.tokens == (5, 2)
    tally = StreamTally(strip_usage=True)
    tally.feed(ROLE + CONTENT * 3 + USAGE_EVENT)
    assert tally.tokens == (5, 3)


@pytest.mark.fast
@pytest.mark.parametrize("strip", [True, False])
def test_a_streams_usage_is_read_however_its_chunks_split_it(strip: bool) -> None:
    expected = WHOLE.replace(USAGE_EVENT, b"") if strip else WHOLE
    for size in (1, 7, len(WHOLE)):
        tally = StreamTally(strip_usage=strip)
        out = b"".join(tally.feed(WHOLE[i : i + size]) for i in range(0, len(WHOLE), size))
        out += tally.end()
        assert out == expected, size
        assert tally.tokens == (5, 2) and tally.reported
        assert tally.done, size  # the terminator went out, however it was split
    # Cut before its usage came: one token per content event relayed, no prompt.
    tally = StreamTally(strip_usage=True)
    assert tally.feed(ROLE + CONTENT + CONTENT + b"data: {") == ROLE + CONTENT + CONTENT
    assert tally.tokens == (0, 2) and not tally.reported
    # Usage beside choices (some llama-server versions) stays where it is.
    inline = b'data: {"choices":[{"delta":{}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}\n'
    assert StreamTally(strip_usage=True).feed(inline) == inline


@pytest.mark.fast
def test_a_stream_is_whole_only_once_its_terminator_line_went_out() -> None:
    """A client that read `data: [DONE]` and closed before the node's end frame reached
    the gateway got the whole answer (counted ok, not client_left); the same words as
    an event's text are only text."""
    tally = StreamTally(strip_usage=False)
    tally.feed(ROLE + b'data: {"choices":[{"delta":{"content":"data: [DONE]"}}]}\n\n')
    assert not tally.done
    tally.feed(b"data: [DONE]")
    assert tally.done
    first = StreamTally(strip_usage=False)
    first.feed(b"data: [DONE]\n\n")
    assert first.done


@pytest.mark.fast
def test_a_nodes_hostile_usage_is_not_counted() -> None:
    assert plain_usage(completion()) == (3, 1)
    deep = b'{"usage": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    huge = b'{"usage": {"prompt_tokens": 1e30, "completion_tokens": 10000000000000}}'
    negative = b'{"usage": {"prompt_tokens": -5, "completion_tokens": 2}}'
    for body in (deep, huge, negative, b'{"usage": "x"}', b"not json"):
        assert plain_usage(body) == (0, 0)
    tally = StreamTally(strip_usage=True)
    line = b"data: " + huge + b"\n\n"
    assert tally.feed(line) == line and tally.tokens == (0, 0)
    # A line past the bound without a newline goes out as it came, unread.
    long = b"data: " + b"x" * 70_000
    assert tally.feed(long) == long


@pytest.mark.fast
def test_each_invoke_counts_once_in_its_minute() -> None:
    now = [120.5]
    usage = GatewayUsage(None, INTERVAL_S, ApiMetrics(), clock=lambda: now[0])  # type: ignore[arg-type]
    scope = ClientScope(uuid.uuid4(), "app", frozenset({"smol"}), frozenset(), None, None)
    meter = usage.meter(scope, "smol")
    meter.ttft_s = 0.3
    assert meter.record("ok", 3, 1)
    assert not meter.record("client_left", 9, 9)
    now[0] = 180.0
    usage.meter(scope, "other").record("model_not_allowed")
    [first, second] = sorted(usage.window(), key=lambda d: d.minute)
    assert (first.minute.minute, first.model, first.outcome, first.requests) == (2, "smol", "ok", 1)
    assert (first.prompt_tokens, first.completion_tokens, first.ttft_count) == (3, 1, 1)
    assert sum(first.ttft_buckets) == 1 and first.ttft_buckets[4] == 1  # 0.25 < 0.3 <= 0.5
    assert (second.minute.minute, second.model, second.requests) == (3, OUT_OF_SCOPE, 1)
    assert sum(second.ttft_buckets) == 0
    assert usage.window() == []


@pytest.mark.fast
async def test_a_failed_flush_loses_its_window_and_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = make_engine("postgresql+asyncpg://nobody:secret-pw@127.0.0.1:9/none")
    usage = GatewayUsage(make_sessionmaker(engine), 0.01, ApiMetrics())
    scope = ClientScope(uuid.uuid4(), "app", frozenset({"smol"}), frozenset(), None, None)
    stop = asyncio.Event()
    with caplog.at_level(logging.WARNING, logger="modelforge.api.gateway.usage"):
        task = asyncio.create_task(usage.run(stop))
        for _ in range(3):
            usage.meter(scope, "smol").record("ok", 3, 1)
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(task, 20)
    await engine.dispose()
    assert usage.window() == []  # every window went, counts and all
    warnings = [r for r in caplog.records if r.name == "modelforge.api.gateway.usage"]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "secret-pw" not in warnings[0].getMessage()
