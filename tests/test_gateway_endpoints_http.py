"""/v1/completions and /v1/embeddings against the real API (issue 34), the test speaking
for the runtime worker over the protocol where an answer is needed: refused fields 422
in OpenAI's envelope naming the field, before any route is chosen (nothing reaches a
node); 404 for an endpoint nothing serves; 422 tools_unsupported for tools no
deployment can call; what each invoke carries; a completions stream's usage, which
rides on its final choice event, relayed whole and counted; embeddings' input tokens
counted; a plain answer past the gateway's bound refused 502 upstream_too_large."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from api.gateway.call import MAX_PLAIN_ANSWER_BYTES, MAX_REFUSAL_BYTES
from schemas.protocol import (
    DEPLOYMENT_JOB_COMPLETE,
    GATEWAY_CHAT_COMPLETIONS,
    GATEWAY_COMPLETIONS,
    GATEWAY_EMBEDDINGS,
    GATEWAY_MODELS,
)
from tests.api_processes import samples
from tests.api_server import ApiFactory, RunningApi
from tests.deployment_flows import (
    HEALTHY,
    DeployedNode,
    answer_invoke,
    beat,
    claim_deployment_job,
    completion,
    create_deployment,
    deployment,
    deployment_body,
    lease_of,
    ready_deployment,
    runtime_channel,
    service_client,
)
from tests.runtime_flows import create_profile, environment_id, ready_node
from tests.test_gateway_errors import envelope

ALL = ["chat", "completions", "embeddings"]
COMPLETION: dict[str, Any] = {"model": "smol", "prompt": "Once", "max_tokens": 4}
EMBEDDING: dict[str, Any] = {"model": "smol", "input": ["a", "b"]}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
TOOLS_CHAT: dict[str, Any] = {
    "model": "smol", "messages": [{"role": "user", "content": "hi"}], "tools": [TOOL],
    "tool_choice": "required",
}  # fmt: skip

REFUSED: list[tuple[str, dict[str, Any], str]] = [
    (GATEWAY_COMPLETIONS, {**COMPLETION, "echo": True}, "echo"),
    (GATEWAY_COMPLETIONS, {**COMPLETION, "suffix": "end"}, "suffix"),
    (GATEWAY_COMPLETIONS, {**COMPLETION, "best_of": 2}, "best_of"),
    (GATEWAY_COMPLETIONS, {**COMPLETION, "logprobs": 2}, "logprobs"),
    (GATEWAY_COMPLETIONS, {**COMPLETION, "logit_bias": {"1": 5}}, "logit_bias"),
    (GATEWAY_COMPLETIONS, {**COMPLETION, "prompt": [1, 2, 3]}, "prompt"),
    (GATEWAY_COMPLETIONS, {**COMPLETION, "prompt": ["a", "b"], "stream": True}, "prompt"),
    (GATEWAY_COMPLETIONS, {**COMPLETION, "n": 2}, "n"),
    (GATEWAY_EMBEDDINGS, {**EMBEDDING, "dimensions": 8}, "dimensions"),
    (GATEWAY_EMBEDDINGS, {**EMBEDDING, "input": [[1, 2, 3]]}, "input"),
    (GATEWAY_EMBEDDINGS, {**EMBEDDING, "input": [1, 2, 3]}, "input"),
    (GATEWAY_EMBEDDINGS, {**EMBEDDING, "input": []}, "input"),
    (GATEWAY_EMBEDDINGS, {**EMBEDDING, "encoding_format": "int8"}, "encoding_format"),
    (GATEWAY_EMBEDDINGS, {**EMBEDDING, "stream": True}, "stream"),
]


@pytest.fixture
def gateway_api(api_factory: ApiFactory) -> RunningApi:
    return api_factory(gateway_first_token_timeout_s=5, gateway_token_gap_timeout_s=5)


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4) as executor:
        yield executor


def _deployed(
    client: httpx.Client, api: RunningApi, hostname: str, *, tools: bool, endpoints: list[str]
) -> DeployedNode:
    """A ready deployment of `smol` serving `endpoints`, whose node reported at the load
    whether its chat template calls tools."""
    node = ready_node(client, api, hostname=hostname)
    beat(client, node)
    profile = create_profile(client, api, name=f"p-{hostname}")
    body = deployment_body(node, profile["id"], environment_id(client, api), endpoints=endpoints)
    created = create_deployment(client, api, body)
    claim = claim_deployment_job(client, node)
    caps = {"supports_tools": tools, "supports_tool_calls": tools}
    loaded = client.post(
        DEPLOYMENT_JOB_COMPLETE.format(job_id=claim["job_id"]),
        json={"kind": "deployment.load.v1", "lease": lease_of(claim), "device_id": "cpu",
              "health": HEALTHY, "load_s": 0.3, "capabilities": caps},
        headers=node.headers,
    )  # fmt: skip
    assert loaded.status_code == 200, loaded.text
    deployed = DeployedNode(node, deployment(client, api, created["id"]))
    assert deployed.deployment["state"] == "ready"
    assert deployed.deployment["capabilities"]["supports_tool_calls"] is tools
    deployed.report(client, loaded=True)
    return deployed


def _serving_all(api: RunningApi) -> tuple[DeployedNode, str]:
    """A ready deployment of `smol` serving every endpoint, and a service client's secret."""
    with api.client() as client:
        return ready_deployment(client, api, endpoints=ALL), service_client(client, api)


def _attempts(client: httpx.Client) -> float:
    return sum(
        value
        for (name, _), value in samples(client).items()
        if name == "modelforge_gateway_attempts_total"
    )


def _invokes(client: httpx.Client, endpoint: str, outcome: str) -> float:
    return sum(
        value
        for (name, labels), value in samples(client).items()
        if name == "modelforge_gateway_invokes_total"
        and ("endpoint", endpoint) in labels
        and ("outcome", outcome) in labels
    )


def _tokens(client: httpx.Client, kind: str) -> float:
    return sum(
        value
        for (name, labels), value in samples(client).items()
        if name == "modelforge_gateway_client_tokens_total" and ("kind", kind) in labels
    )


def _post(api: RunningApi, path: str, secret: str, body: dict[str, Any]) -> httpx.Response:
    with api.client() as client:
        return client.post(path, json=body, headers={"Authorization": f"Bearer {secret}"})


def test_refused_fields_are_422_naming_them_and_reach_no_node(api: RunningApi) -> None:
    with api.client() as client:
        ready_deployment(client, api, endpoints=ALL)
        auth = {"Authorization": f"Bearer {service_client(client, api)}"}
        before = _attempts(client)
        for path, body, param in REFUSED:
            refused = client.post(path, json=body, headers=auth)
            error = envelope(refused, 422, "validation_failed")
            assert error["param"].startswith(param), (path, body, error)
        assert _attempts(client) == before
        # What clients send passes (no runtime channel here: 503).
        for path, body in (
            (GATEWAY_COMPLETIONS, {**COMPLETION, "prompt": ["a", "b"], "echo": False}),
            (GATEWAY_COMPLETIONS, {**COMPLETION, "stream": True}),
            (GATEWAY_EMBEDDINGS, {**EMBEDDING, "encoding_format": "base64"}),
            (GATEWAY_EMBEDDINGS, {"model": "smol", "input": "one"}),
        ):
            envelope(client.post(path, json=body, headers=auth), 503, "no_ready_deployment")


def test_an_endpoint_nothing_serves_is_404_and_models_list_the_endpoints(
    api: RunningApi,
) -> None:
    with api.client() as client:
        ready_deployment(client, api)  # chat and completions: the default
        auth = {"Authorization": f"Bearer {service_client(client, api)}"}
        error = envelope(client.post(GATEWAY_EMBEDDINGS, json=EMBEDDING, headers=auth), 404)
        assert error["code"] == "model_not_found" and "embeddings" in error["message"]
        envelope(client.post(GATEWAY_COMPLETIONS, json=COMPLETION, headers=auth), 503)
        models = client.get(GATEWAY_MODELS, headers=auth).json()["data"]
        assert {m["id"]: m["endpoints"] for m in models} == {
            "smol": ["chat", "completions"],
            "planner": ["chat", "completions"],
        }
        assert _invokes(client, "embeddings", "model_not_found") == 1


def test_tools_go_only_to_a_model_whose_template_calls_them(api: RunningApi) -> None:
    with api.client() as client:
        _deployed(client, api, "plain-host", tools=False, endpoints=["chat"])
        auth = {"Authorization": f"Bearer {service_client(client, api)}"}
        before = _attempts(client)
        refused = client.post(GATEWAY_CHAT_COMPLETIONS, json=TOOLS_CHAT, headers=auth)
        error = envelope(refused, 422, "tools_unsupported")
        assert error["param"] == "tools"
        assert _attempts(client) == before
        # Tools the client will not have called are no reason to refuse.
        unused = {**TOOLS_CHAT, "tool_choice": "none"}
        envelope(client.post(GATEWAY_CHAT_COMPLETIONS, json=unused, headers=auth), 503)
        # Once one deployment of the model calls tools, the request is routed (to it).
        _deployed(client, api, "tools-host", tools=True, endpoints=["chat"])
        routed = client.post(GATEWAY_CHAT_COMPLETIONS, json=TOOLS_CHAT, headers=auth)
        envelope(routed, 503, "no_ready_deployment")


def test_completions_and_embeddings_cross_typed_and_their_tokens_count(
    gateway_api: RunningApi, pool: ThreadPoolExecutor
) -> None:
    api = gateway_api
    deployed, secret = _serving_all(api)
    with runtime_channel(api, deployed.node) as channel:
        # A streamed completion: usage on the final choice event, which the client gets
        # whole though it did not ask for usage.
        streamed: Future[httpx.Response] = pool.submit(
            _post, api, GATEWAY_COMPLETIONS, secret, {**COMPLETION, "stream": True}
        )
        invoke = channel.next_invoke()
        asked = {"endpoint": "completions", "prompt": "Once", "max_tokens": 4, "stream": True,
                 "include_usage": True}  # fmt: skip
        assert {key: invoke["params"][key] for key in asked} == asked
        final = {
            "choices": [{"index": 0, "text": "!", "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4},
        }
        events = [
            b'data: {"choices":[{"index":0,"text":"Upon","finish_reason":null}]}\n\n',
            f"data: {json.dumps(final)}\n\n".encode(),
            b"data: [DONE]\n\n",
        ]
        answer_invoke(api, deployed.node, invoke, events, content_type="text/event-stream")
        text = streamed.result(20).text
        assert '"usage"' in text and '"finish_reason": "stop"' in text and "[DONE]" in text
        # Two prompts: each completes up to max_tokens, so 8 tokens are not too many.
        listed: Future[httpx.Response] = pool.submit(
            _post, api, GATEWAY_COMPLETIONS, secret, {**COMPLETION, "prompt": ["a", "b"]}
        )
        invoke = channel.next_invoke()
        assert invoke["params"]["prompt"] == ["a", "b"]
        choices = [{"index": i, "text": "xy", "finish_reason": "length"} for i in range(2)]
        usage = {"prompt_tokens": 2, "completion_tokens": 8, "total_tokens": 10}
        answer = {"object": "text_completion", "choices": choices, "usage": usage}
        answer_invoke(api, deployed.node, invoke, json.dumps(answer).encode())
        assert listed.result(20).status_code == 200
        # Embeddings: input always a list on the wire; usage is prompt tokens only.
        embedded: Future[httpx.Response] = pool.submit(
            _post, api, GATEWAY_EMBEDDINGS, secret, {"model": "smol", "input": "one"}
        )
        invoke = channel.next_invoke()
        assert invoke["params"] == {
            "endpoint": "embeddings", "input": ["one"], "encoding_format": "float",
            "stream": False,
        }  # fmt: skip
        answer = {"object": "list", "model": "smol",
                  "data": [{"object": "embedding", "index": 0, "embedding": [0.6, 0.8]}],
                  "usage": {"prompt_tokens": 3, "total_tokens": 3}}  # fmt: skip
        answer_invoke(api, deployed.node, invoke, json.dumps(answer).encode())
        response = embedded.result(20)
        assert response.status_code == 200, response.text
        assert response.json()["data"][0]["embedding"] == [0.6, 0.8]
    with api.client() as client:
        assert _invokes(client, "completions", "ok") == 2
        assert _invokes(client, "embeddings", "ok") == 1
        assert (_tokens(client, "prompt"), _tokens(client, "completion")) == (7, 10)


def test_a_plain_answer_past_the_bound_is_refused_502(
    gateway_api: RunningApi, pool: ThreadPoolExecutor
) -> None:
    api = gateway_api
    deployed, secret = _serving_all(api)
    with runtime_channel(api, deployed.node) as channel:
        embedded: Future[httpx.Response] = pool.submit(
            _post, api, GATEWAY_EMBEDDINGS, secret, EMBEDDING
        )
        invoke = channel.next_invoke()
        chunk = b"0" * (1024 * 1024)
        chunks = [chunk] * (MAX_PLAIN_ANSWER_BYTES // len(chunk) + 1)
        answer_invoke(api, deployed.node, invoke, iter(chunks))
        envelope(embedded.result(60), 502, "upstream_too_large")
        # The node is told to stop at once.
        assert channel.wait_for("cancel")["invoke_id"] == invoke["invoke_id"]


def test_a_node_that_does_not_serve_the_endpoint_is_passed_over_not_cooled(
    gateway_api: RunningApi, pool: ThreadPoolExecutor
) -> None:
    """The route table said embeddings; the node says no (endpoint_not_served, a
    retryable refusal): with no other deployment the client gets 503, and the
    deployment still takes the next invoke (its chat is not cooled down for it)."""
    api = gateway_api
    deployed, secret = _serving_all(api)
    refusal = json.dumps({"code": "endpoint_not_served", "message": "no"}).encode()
    with runtime_channel(api, deployed.node) as channel:
        refused: Future[httpx.Response] = pool.submit(
            _post, api, GATEWAY_EMBEDDINGS, secret, EMBEDDING
        )
        answer_invoke(api, deployed.node, channel.next_invoke(), refusal, status=404)
        envelope(refused.result(20), 503, "no_ready_deployment")
        chat: Future[httpx.Response] = pool.submit(
            _post, api, GATEWAY_CHAT_COMPLETIONS, secret,
            {"model": "smol", "messages": [{"role": "user", "content": "hi"}]},
        )  # fmt: skip
        answer_invoke(api, deployed.node, channel.next_invoke(), completion("ready"))
        assert chat.result(20).status_code == 200


def test_a_list_whose_later_prompt_is_refused_still_counts_what_was_generated(
    gateway_api: RunningApi, pool: ThreadPoolExecutor
) -> None:
    """The worker asks a list's prompts one by one: when llama-server refuses a later
    one, the earlier ones were generated all the same. Its passed-on refusal carries
    their usage, and the gateway meters it (bounded as any usage): otherwise 15 prompts
    of 8192 tokens and a 16th over the context would cost the client nothing."""
    api = gateway_api
    deployed, secret = _serving_all(api)
    with runtime_channel(api, deployed.node) as channel:
        refused: Future[httpx.Response] = pool.submit(
            _post, api, GATEWAY_COMPLETIONS, secret, {**COMPLETION, "prompt": ["a", "b"]}
        )
        usage = {"prompt_tokens": 1, "completion_tokens": 4, "total_tokens": 5}
        error = {"error": {"code": 400, "message": "too long"}, "usage": usage}
        body = json.dumps(error).encode()
        answer_invoke(api, deployed.node, channel.next_invoke(), body, status=400)
        envelope(refused.result(20), 422, "validation_failed")
    with api.client() as client:
        assert _invokes(client, "completions", "upstream_4xx") == 1
        assert (_tokens(client, "prompt"), _tokens(client, "completion")) == (1, 4)


def test_a_refusal_body_is_read_within_a_bound(
    gateway_api: RunningApi, pool: ThreadPoolExecutor
) -> None:
    """A node's non-200 answer is read for its refusal code: a huge one is not held
    whole (the node is outside the trust boundary); the client gets an answer."""
    api = gateway_api
    deployed, secret = _serving_all(api)
    with runtime_channel(api, deployed.node) as channel:
        refused: Future[httpx.Response] = pool.submit(
            _post, api, GATEWAY_EMBEDDINGS, secret, EMBEDDING
        )
        invoke = channel.next_invoke()
        chunk = b" " * (1024 * 1024)
        chunks = [chunk] * (MAX_REFUSAL_BYTES // len(chunk) + 2)
        answer_invoke(api, deployed.node, invoke, iter(chunks), status=503)
        response = refused.result(60)
        assert response.status_code in (422, 502, 503), response.text
        # Read no further than the bound: the node is told to stop.
        assert channel.wait_for("cancel")["invoke_id"] == invoke["invoke_id"]


def test_a_model_servers_own_failure_is_502_not_a_validation_error(
    gateway_api: RunningApi, pool: ThreadPoolExecutor
) -> None:
    """llama-server's 5xx on a request is its failure, not the client's: 502
    upstream_failed in the envelope (a 4xx stays 422: the request is what it refused)."""
    api = gateway_api
    deployed, secret = _serving_all(api)
    with runtime_channel(api, deployed.node) as channel:
        failed: Future[httpx.Response] = pool.submit(
            _post, api, GATEWAY_COMPLETIONS, secret, COMPLETION
        )
        body = json.dumps({"error": {"code": 500, "message": "boom"}}).encode()
        answer_invoke(api, deployed.node, channel.next_invoke(), body, status=500)
        envelope(failed.result(20), 502, "upstream_failed")
    with api.client() as client:
        assert _invokes(client, "completions", "upstream_5xx") == 1


def test_a_whole_list_completion_waits_for_every_prompt_before_its_first_byte(
    gateway_api: RunningApi, pool: ThreadPoolExecutor
) -> None:
    """The worker answers a plain list of prompts once every prompt was generated, one
    after another: the wait for its first byte is the first-token bound per prompt, so
    a slow but working deployment is not cut off, cooled down and unbilled. Here the
    node answers 3 prompts past one bound (5 s) and within three."""
    api = gateway_api
    deployed, secret = _serving_all(api)
    with runtime_channel(api, deployed.node) as channel:
        answered: Future[httpx.Response] = pool.submit(
            _post, api, GATEWAY_COMPLETIONS, secret, {**COMPLETION, "prompt": ["a", "b", "c"]}
        )
        invoke = channel.next_invoke()
        # The node's three generations, deliberately slower than one bound.
        threading.Event().wait(6.5)
        answer_invoke(api, deployed.node, invoke, completion("abc"))
        assert answered.result(30).status_code == 200
