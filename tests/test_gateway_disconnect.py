"""A client that leaves before its answer opens cancels its invoke at once, plain or
streamed: the node is told (its `cancel` on the runtime channel) and the client's
concurrency slot and the deployment's in-flight count are freed, long before the
time-to-first-token bound would have given up on it. The test holds the node's runtime
channel and never answers; the client is a raw socket that sends its request and
closes."""

from __future__ import annotations

import json
import socket
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

import pytest

from schemas.protocol import GATEWAY_CHAT_COMPLETIONS, SERVICE_CLIENTS
from tests.agent.harness import wait_until
from tests.api_server import ApiFactory, RunningApi
from tests.deployment_flows import ready_deployment, runtime_channel, service_client

FIRST_TOKEN_TIMEOUT_S = 60
# Much less than the bound above: the cancel comes from the client leaving, not from it.
CANCEL_WITHIN_S = 10


@pytest.fixture
def gateway_api(api_factory: ApiFactory) -> RunningApi:
    return api_factory(gateway_first_token_timeout_s=FIRST_TOKEN_TIMEOUT_S)


def open_call(api: RunningApi, secret: str, body: dict[str, Any]) -> socket.socket:
    """A chat completion sent whole on a raw connection, its answer never read."""
    address = urlsplit(api.base_url)
    payload = json.dumps(body).encode()
    head = (
        f"POST {GATEWAY_CHAT_COMPLETIONS} HTTP/1.1\r\n"
        f"Host: {address.netloc}\r\n"
        f"Authorization: Bearer {secret}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    connection = socket.create_connection((address.hostname, address.port), timeout=10)
    connection.sendall(head.encode() + payload)
    return connection


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_client_that_leaves_before_the_first_token_cancels_its_invoke_at_once(
    gateway_api: RunningApi, stream: bool
) -> None:
    with gateway_api.client() as client:
        deployed = ready_deployment(client, gateway_api)
        created = client.post(
            SERVICE_CLIENTS,
            json={"name": "app", "models": ["smol"], "roles": [], "max_concurrent": 1},
            headers=gateway_api.admin_headers,
        )
        assert created.status_code == 201, created.text
    secret, client_id = created.json()["secret"], uuid.UUID(created.json()["id"])
    deployment_id = uuid.UUID(deployed.deployment["id"])
    body = {"model": "smol", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    state = gateway_api.state
    with runtime_channel(gateway_api, deployed.node) as channel:
        # Twice: the second call is admitted only if the first one freed the client's
        # one concurrency slot.
        for _ in range(2):
            connection = open_call(gateway_api, secret, body)
            invoke = channel.next_invoke()
            assert invoke["params"]["stream"] is stream
            left = time.monotonic()
            connection.close()
            cancel = channel.wait_for("cancel", CANCEL_WITHIN_S)
            assert cancel["invoke_id"] == invoke["invoke_id"]
            assert time.monotonic() - left < CANCEL_WITHIN_S

            def freed() -> bool:
                return (
                    state.client_limits.in_flight(client_id) == 0
                    and state.invokes.in_flight[deployment_id] == 0
                )

            wait_until(freed, CANCEL_WITHIN_S, "the client's slot and the deployment's count")


def test_across_api_processes_the_cancel_travels_over_nats(api_factory: ApiFactory) -> None:
    """The client on one API process, the node's runtime channel on another: the
    client's leaving reaches the node as a cancel on the node's NATS subject."""
    gateway, holder = (
        api_factory(gateway_first_token_timeout_s=FIRST_TOKEN_TIMEOUT_S) for _ in range(2)
    )
    with gateway.client() as client:
        deployed = ready_deployment(client, gateway)
        secret = service_client(client, gateway)
    body = {"model": "smol", "messages": [{"role": "user", "content": "hi"}]}
    with runtime_channel(holder, deployed.node) as channel:

        def connected() -> bool:
            return bool(holder.state.invokes.connected and gateway.state.invokes.connected)

        wait_until(connected, 20, "both relays on NATS")
        connection = open_call(gateway, secret, body)
        invoke = channel.next_invoke()
        assert invoke["gateway"] == gateway.state.invokes.id
        connection.close()
        assert channel.wait_for("cancel", CANCEL_WITHIN_S)["invoke_id"] == invoke["invoke_id"]
