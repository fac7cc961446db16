"""Deployments and the gateway end to end, all real: the API with its workers' pipeline,
an agent that acquired the model through an artifact job, the runtime worker beside it
(a real llama-server with the small model), and the official `openai` client calling
the control plane's gateway. The runtime worker is reached only over its own outbound
connections: its runtime channel carries the invoke, its answer stream the tokens."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import openai

from schemas.protocol import (
    DEPLOYMENTS,
    ROUTE_DEPLOYMENT_HEADER,
    ROUTE_DEVICE_HEADER,
    ROUTE_NODE_HEADER,
    ROUTE_OVERHEAD_HEADER,
    ROUTE_REASON_HEADER,
)
from tests.agent.harness import admin
from tests.deployment_flows import wait_for_deployment
from tests.runtime.probing import MESSAGES, ProbeNode, deployed, gateway_client


def test_load_ready_and_invoke_plain_and_streamed_through_the_openai_client(
    probe_node: ProbeNode,
) -> None:
    runtime, environment = probe_node.runtime()
    deployment = deployed(probe_node, environment)
    client = gateway_client(probe_node)
    assert "smol" in [model.id for model in client.models.list()]

    raw = client.chat.completions.with_raw_response.create(
        model="smol", messages=MESSAGES, max_tokens=8, temperature=0
    )
    answer = raw.parse()
    assert answer.choices[0].message.content, (answer, runtime.output[-2000:])
    assert answer.model == "smol"  # llama-server answers under the served name
    assert raw.headers[ROUTE_DEPLOYMENT_HEADER] == deployment["id"]
    assert raw.headers[ROUTE_NODE_HEADER] == probe_node.node_id
    assert raw.headers[ROUTE_DEVICE_HEADER] == "cpu"
    assert raw.headers[ROUTE_REASON_HEADER] == "only"
    assert float(raw.headers[ROUTE_OVERHEAD_HEADER]) >= 0

    # By role, streamed.
    pieces = []
    finish = None
    for chunk in client.chat.completions.create(
        model="planner", messages=MESSAGES, max_tokens=8, temperature=0, stream=True
    ):
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(pieces) and finish in ("stop", "length"), runtime.output[-2000:]


def test_a_drain_lets_the_stream_in_flight_finish_then_unloads(probe_node: ProbeNode) -> None:
    runtime, environment = probe_node.runtime()
    deployment = deployed(probe_node, environment)
    client = gateway_client(probe_node)
    started = threading.Event()

    def long_stream() -> tuple[str, str | None]:
        text, finish = "", None
        for chunk in client.chat.completions.create(
            model="smol", messages=MESSAGES, max_tokens=96, temperature=0, stream=True,
            extra_body={"seed": 1},
        ):  # fmt: skip
            started.set()
            for choice in chunk.choices:
                text += choice.delta.content or ""
                finish = choice.finish_reason or finish
        return text, finish

    with ThreadPoolExecutor(1) as pool:
        streamed = pool.submit(long_stream)
        assert started.wait(60), runtime.output[-2000:]
        drained = admin(
            probe_node.api,
            "POST",
            f"{DEPLOYMENTS}/{deployment['id']}/drain",
            json={"deadline_s": 60},
        )
        assert drained["state"] == "draining"
        # New invokes stop at once: nothing else serves the model.
        try:
            client.chat.completions.create(model="smol", messages=MESSAGES, max_tokens=2)
            raise AssertionError("a draining deployment took a new invoke")
        except openai.APIStatusError as refused:
            assert refused.status_code == 503
        text, finish = streamed.result(90)
    assert text and finish in ("stop", "length")

    wait_for_deployment(probe_node.api, deployment["id"], "unloaded", 60)
