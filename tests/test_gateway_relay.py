"""The gateway's invoke path against the real API, the test speaking for the runtime
worker over the protocol (its runtime channel, its answer stream): what an invoke
carries, route receipts, the lease fence on answers, retries before the first byte,
terminal errors after it, a client that leaves, and the 403/404/429/503 answers."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from schemas.gateway import InvokeParams
from schemas.protocol import (
    DEPLOYMENTS,
    GATEWAY_CHAT_COMPLETIONS,
    GATEWAY_MODELS,
    ROUTE_DEPLOYMENT_HEADER,
    ROUTE_DEVICE_HEADER,
    ROUTE_NODE_HEADER,
    ROUTE_OVERHEAD_HEADER,
    ROUTE_REASON_HEADER,
)
from tests.agent.harness import wait_until
from tests.api_server import ApiFactory, RunningApi
from tests.deployment_flows import (
    answer_invoke,
    completion,
    create_deployment,
    deployment,
    deployment_body,
    ready_deployment,
    runtime_channel,
    service_client,
)
from tests.runtime_flows import create_profile, environment_id, ready_node

CHAT = {"model": "smol", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture
def gateway_api(api_factory: ApiFactory) -> RunningApi:
    return api_factory(gateway_first_token_timeout_s=5, gateway_token_gap_timeout_s=5)


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4) as executor:
        yield executor


@contextlib.contextmanager
def streamed(api: RunningApi, secret: str) -> Iterator[httpx.Response]:
    """A streamed chat completion, open."""
    with (
        httpx.Client(base_url=api.base_url, timeout=20) as client,
        client.stream(
            "POST",
            GATEWAY_CHAT_COMPLETIONS,
            json={**CHAT, "stream": True},
            headers={"Authorization": f"Bearer {secret}"},
        ) as response,
    ):
        yield response


def call(api: RunningApi, secret: str, body: dict[str, Any] | None = None) -> httpx.Response:
    with api.client() as client:
        return client.post(
            GATEWAY_CHAT_COMPLETIONS,
            json=body or CHAT,
            headers={"Authorization": f"Bearer {secret}"},
        )


def answered_by_node(
    api: RunningApi, pool: ThreadPoolExecutor, body: bytes, **answer: Any
) -> httpx.Response:
    """A client's call, answered by the deployment's node with `body`: the client's
    response."""
    with api.client() as client:
        deployed = ready_deployment(client, api)
        secret = service_client(client, api)
    with runtime_channel(api, deployed.node) as channel:
        answered: Future[httpx.Response] = pool.submit(call, api, secret)
        invoke = channel.next_invoke()
        stream = answer_invoke(api, deployed.node, invoke, body, **answer)
        assert stream.status_code == 200, stream.text
        return answered.result(20)


def test_an_invoke_carries_typed_parameters_and_its_answer_comes_back_with_receipts(
    gateway_api: RunningApi, pool: ThreadPoolExecutor
) -> None:
    with gateway_api.client() as client:
        deployed = ready_deployment(client, gateway_api)
        secret = service_client(client, gateway_api)
    with runtime_channel(gateway_api, deployed.node) as channel:
        asked = {**CHAT, "temperature": 0.2, "stop": "\n", "seed": 7}
        answered: Future[httpx.Response] = pool.submit(call, gateway_api, secret, asked)
        invoke = channel.next_invoke()
        assert invoke["kind"] == "deployment.invoke.v1"
        assert invoke["deployment_id"] == deployed.deployment["id"]
        assert invoke["lease"]["epoch"] == 1
        # Only the typed parameters cross: nothing that could become a flag or a path.
        assert set(invoke["params"]) <= set(InvokeParams.model_fields)
        assert invoke["params"]["stop"] == ["\n"] and invoke["params"]["max_tokens"] == 4
        stream = answer_invoke(gateway_api, deployed.node, invoke, completion("ready"))
        assert stream.status_code == 200 and stream.json()["accepted"], stream.text
        response = answered.result(20)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "ready"
    assert response.headers[ROUTE_DEPLOYMENT_HEADER] == deployed.deployment["id"]
    assert response.headers[ROUTE_NODE_HEADER] == deployed.node.node_id
    assert response.headers[ROUTE_DEVICE_HEADER] == "cpu"
    assert response.headers[ROUTE_REASON_HEADER] == "only"
    assert float(response.headers[ROUTE_OVERHEAD_HEADER]) >= 0


@pytest.mark.parametrize("claimed", ["text/html; charset=utf-8", "image/svg+xml", "x" * 100])
def test_the_answer_is_served_as_json_whatever_content_type_the_node_claims(
    gateway_api: RunningApi, pool: ThreadPoolExecutor, claimed: str
) -> None:
    """The node is outside the trust boundary: an answer it labels as a page or an
    image would run as one on the API's origin (the dashboard's), so a plain answer is
    always served as JSON, never sniffed."""
    script = completion("<script>x()</script>")
    response = answered_by_node(gateway_api, pool, script, content_type=claimed)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.json()["choices"][0]["message"]["content"] == "<script>x()</script>"


def test_a_refusal_body_nested_past_any_parser_is_passed_through_as_a_422(
    gateway_api: RunningApi, pool: ThreadPoolExecutor
) -> None:
    """The refusal's body is the node's: reading its code must not recurse (json's
    parser raised RecursionError on it, a 500 to the client)."""
    nested = b"[" * 200_000 + b"]" * 200_000
    response = answered_by_node(gateway_api, pool, nested, status=400)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "validation_failed"


def test_a_stale_invoke_lease_holder_is_refused(
    gateway_api: RunningApi, pool: ThreadPoolExecutor
) -> None:
    with gateway_api.client() as client:
        deployed = ready_deployment(client, gateway_api)
        other = ready_node(client, gateway_api, hostname="gpu-host-2")
        secret = service_client(client, gateway_api)
    with runtime_channel(gateway_api, deployed.node) as channel:
        answered = pool.submit(call, gateway_api, secret)
        invoke = channel.next_invoke()
        node = deployed.node
        older = answer_invoke(gateway_api, node, invoke, b"{}", epoch=invoke["lease"]["epoch"] + 1)
        assert older.status_code == 409 and older.json()["code"] == "lease_stale"
        wrong = answer_invoke(
            gateway_api, node, invoke, b"{}", lease_id="00000000-0000-4000-8000-000000000000"
        )
        assert wrong.status_code == 409 and wrong.json()["code"] == "lease_stale"
        stolen = answer_invoke(gateway_api, other, invoke, b"{}")
        assert stolen.status_code == 403 and stolen.json()["code"] == "job_not_owned"
        unknown = answer_invoke(
            gateway_api,
            node,
            {**invoke, "invoke_id": "00000000-0000-4000-8000-000000000001"},
            b"{}",
        )
        assert unknown.status_code == 404
        for refused in (older, wrong, stolen, unknown):
            assert refused.json()["correlation_id"]
        # None of the refused answers reached the client; the holder's does.
        assert answer_invoke(gateway_api, node, invoke, completion("mine")).status_code == 200
        response = answered.result(20)
    assert response.json()["choices"][0]["message"]["content"] == "mine"


def test_a_stream_is_relayed_and_a_node_lost_mid_stream_ends_it_with_an_error_event(
    gateway_api: RunningApi, pool: ThreadPoolExecutor
) -> None:
    with gateway_api.client() as client:
        deployed = ready_deployment(client, gateway_api)
        secret = service_client(client, gateway_api)
    chunks = [
        b'data: {"choices":[{"delta":{"content":"re"}}]}\n\n',
        b'data: {"choices":[{"delta":{"content":"ady"}}]}\n\n',
        b"data: [DONE]\n\n",
    ]

    first_byte = threading.Event()

    def stream_call() -> list[str]:
        with streamed(gateway_api, secret) as response:
            assert response.status_code == 200
            assert response.headers[ROUTE_NODE_HEADER] == deployed.node.node_id
            first_byte.set()
            return [line for line in response.iter_lines() if line]

    with runtime_channel(gateway_api, deployed.node) as channel:
        whole = pool.submit(stream_call)
        invoke = channel.next_invoke()
        assert invoke["params"]["stream"] is True
        sent = answer_invoke(
            gateway_api, deployed.node, invoke, chunks, content_type="text/event-stream"
        )
        assert sent.status_code == 200
        assert whole.result(20)[-1] == "data: [DONE]"

        cut = pool.submit(stream_call)
        invoke = channel.next_invoke()

        first_byte.clear()

        def dies() -> Iterator[bytes]:
            yield chunks[0]
            # Once the first byte reached the client (before it, the gateway would
            # retry elsewhere), the node goes away.
            assert first_byte.wait(20)
            raise ConnectionResetError("the node went away")

        with pytest.raises((httpx.HTTPError, ConnectionResetError)):
            answer_invoke(
                gateway_api, deployed.node, invoke, dies(), content_type="text/event-stream"
            )
        lines = cut.result(20)
    assert lines[0] == chunks[0].decode().strip()
    error = json.loads(lines[-1].removeprefix("data:"))
    assert error["error"]["code"] == "node_lost"
    # The envelope every /v1 refusal has, the request's correlation id in it.
    assert set(error) == {"error"}
    assert {"message", "type", "param", "code", "correlation_id"} <= set(error["error"])
    assert error["error"]["type"] == "server_error" and error["error"]["correlation_id"]


def test_a_client_that_leaves_cancels_its_invoke(
    gateway_api: RunningApi, pool: ThreadPoolExecutor
) -> None:
    with gateway_api.client() as client:
        deployed = ready_deployment(client, gateway_api)
        secret = service_client(client, gateway_api)
    with runtime_channel(gateway_api, deployed.node) as channel:

        def leaves_after_first_chunk() -> str:
            with streamed(gateway_api, secret) as response:
                for line in response.iter_lines():
                    return line  # and close the connection
            return ""

        left = pool.submit(leaves_after_first_chunk)
        invoke = channel.next_invoke()

        def slow() -> Iterator[bytes]:
            yield b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
            channel.wait_for("cancel")  # the node is told, while it still streams
            yield b"data: [DONE]\n\n"

        answer_invoke(gateway_api, deployed.node, invoke, slow(), content_type="text/event-stream")
        assert left.result(20).startswith("data:")


def test_a_deployment_with_no_channel_is_passed_over_and_cools_down(
    gateway_api: RunningApi, pool: ThreadPoolExecutor
) -> None:
    with gateway_api.client() as client:
        silent = ready_deployment(client, gateway_api, hostname="gpu-host-1")
        served = ready_deployment(client, gateway_api, hostname="gpu-host-2")
        secret = service_client(client, gateway_api)
    with runtime_channel(gateway_api, served.node) as channel:

        def one() -> None:
            answered = pool.submit(call, gateway_api, secret)
            invoke = channel.next_invoke()
            answer_invoke(gateway_api, served.node, invoke, completion())
            response = answered.result(20)
            assert response.status_code == 200
            assert response.headers[ROUTE_NODE_HEADER] == served.node.node_id

        def cooled() -> dict[str, Any] | None:
            one()
            with gateway_api.client() as client:
                view = deployment(client, gateway_api, silent.deployment["id"])
            return view if view["cooldown_until"] else None

        view = wait_until(cooled, 30, "the silent deployment cooling down")
    assert "unreachable" in view["cooldown_reason"]


def test_refusals_404_403_429_and_503_with_retry_after(gateway_api: RunningApi) -> None:
    with gateway_api.client() as client:
        deployed = ready_deployment(client, gateway_api)
        secret = service_client(client, gateway_api, models=["smol", "nobody-serves"])
        limited = service_client(client, gateway_api, rate_per_minute=1)
        narrow = service_client(client, gateway_api, models=["other"], roles=[])
        # A second model that is deployed but not ready: its load was never claimed.
        profile = create_profile(client, gateway_api, name="p-pending")
        environment = environment_id(client, gateway_api)
        body = deployment_body(deployed.node, profile["id"], environment, model="pending-model")
        pending = create_deployment(client, gateway_api, body)
        assert pending["state"] == "pending"
        waiting = service_client(client, gateway_api, models=["pending-model"])
        models = client.get(GATEWAY_MODELS, headers={"Authorization": f"Bearer {secret}"})
    # What the client may call and someone serves: the model, and its role (not the
    # model it is not scoped to, nor the one nobody serves).
    listed_models = [(m["id"], m["kind"]) for m in models.json()["data"]]
    assert listed_models == [("smol", "model"), ("planner", "role")]
    missing = call(gateway_api, secret, {**CHAT, "model": "nobody-serves"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    outside = call(gateway_api, narrow)
    assert outside.status_code == 403 and outside.json()["error"]["code"] == "model_not_allowed"
    not_ready = call(gateway_api, waiting, {**CHAT, "model": "pending-model"})
    assert not_ready.status_code == 503
    assert not_ready.json()["error"]["code"] == "no_ready_deployment"
    assert int(not_ready.headers["Retry-After"]) >= 1
    # The limited client's one request a minute goes to the deployment (whose node holds
    # no channel here: 503); the next is refused before any routing.
    call(gateway_api, limited)
    refused = call(gateway_api, limited)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limited"
    assert int(refused.headers["Retry-After"]) >= 1
    assert refused.json()["error"]["correlation_id"]
    with gateway_api.client() as client:
        listed = client.get(DEPLOYMENTS, headers=gateway_api.admin_headers).json()["items"]
    assert {d["model"] for d in listed} == {"smol", "pending-model"}


def test_across_api_processes_the_invoke_and_its_answer_travel_over_nats(
    api_factory: ApiFactory, pool: ThreadPoolExecutor
) -> None:
    """The client on one API process, the node's channel on a second, its answer stream
    to a third: the invoke is a NATS request on the node's subject, the answer's frames
    go to the gateway process's subject, and the fence holds there too."""
    gateway, holder, answers = (api_factory(gateway_first_token_timeout_s=10) for _ in range(3))
    with gateway.client() as client:
        deployed = ready_deployment(client, gateway)
        secret = service_client(client, gateway)
    with runtime_channel(holder, deployed.node) as channel:

        def delivered() -> bool:
            # The holder subscribes for the node once its NATS connection is up.
            return bool(holder.state.invokes.connected and gateway.state.invokes.connected)

        wait_until(delivered, 20, "both relays on NATS")
        answered = pool.submit(call, gateway, secret)
        invoke = channel.next_invoke()
        assert invoke["gateway"] == gateway.state.invokes.id
        older = answer_invoke(
            answers, deployed.node, invoke, b"{}", epoch=invoke["lease"]["epoch"] + 1
        )
        assert older.status_code == 409 and older.json()["code"] == "lease_stale"
        sent = answer_invoke(answers, deployed.node, invoke, completion("far"))
        assert sent.status_code == 200 and sent.json()["accepted"], sent.text
        response = answered.result(20)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "far"
