"""ProtocolClient: status and error code to the exception hierarchy, failure classes from
real sockets, and the retry policy (transient only, backoff, stops when asked)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from agent.client import ProtocolClient, make_http_client
from agent.errors import (
    Conflict,
    FailureClass,
    Refused,
    Rejected,
    RejectionKind,
    RequestFailed,
    Transient,
    final_for_payload,
    stops_publishing,
)
from agent.retry import Stopped, backoff_s, retry_transient
from schemas.agent import EnrollRequest, HeartbeatRequest, TelemetryReport

pytestmark = pytest.mark.fast

CANARY = "canary-echo-0123456789"
CREDENTIAL = f"mfn.{uuid.uuid4().hex}.client-test-secret-0123456789"
NODE = uuid.uuid4()


def error_body(code: str, **extra: Any) -> dict[str, Any]:
    return {
        "code": code,
        "message": f"server says {CANARY}",
        "correlation_id": "c-1",
        "details": [],
        "extra": {"echo": CANARY, **extra},
    }


def client_answering(
    status: int, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[ProtocolClient, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return httpx.Response(status, content=content, headers=headers or {})

    http = httpx.AsyncClient(base_url="http://api.test", transport=httpx.MockTransport(handle))
    return ProtocolClient(http, CREDENTIAL), seen


def heartbeat() -> HeartbeatRequest:
    return HeartbeatRequest(node_id=NODE, protocol_version=1, agent_version="0.1.0")


def telemetry() -> TelemetryReport:
    return TelemetryReport(
        node_id=NODE,
        sequence=5,
        observed_at=datetime.now(UTC),
        ram_total_bytes=1,
        ram_used_bytes=1,
    )


@pytest.mark.parametrize(
    ("status", "code", "kind", "rejection"),
    [
        (503, "internal_error", Transient, None),
        (500, "internal_error", Transient, None),
        (429, "internal_error", Transient, None),
        (401, "credential_revoked", Rejected, RejectionKind.REVOKED),
        (401, "credential_invalid", Rejected, RejectionKind.INVALID),
        (401, "node_decommissioned", Rejected, RejectionKind.DECOMMISSIONED),
        (403, "node_disabled", Rejected, RejectionKind.DISABLED),
        (403, "node_mismatch", Rejected, RejectionKind.MISMATCH),
        (403, "some_future_code", Rejected, RejectionKind.DISABLED),
        (422, "validation_failed", Refused, None),
        (404, "not_found", Refused, None),
        (413, "body_too_large", Refused, None),
        (409, "protocol_version_unsupported", Conflict, None),
    ],
)
async def test_statuses_map_to_the_hierarchy(
    status: int, code: str, kind: type[RequestFailed], rejection: RejectionKind | None
) -> None:
    client, _ = client_answering(status, error_body(code), {"X-Correlation-ID": "corr-1"})
    with pytest.raises(kind) as caught:
        await client.heartbeat(heartbeat())
    error = caught.value
    assert (error.status, error.method, error.path) == (status, "POST", "/api/v1/agent/heartbeat")
    assert error.failure_class is FailureClass.HTTP and error.correlation_id == "corr-1"
    assert (error.code.value if error.code else None) == (
        None if code == "some_future_code" else code
    )
    if rejection is not None:
        assert isinstance(error, Rejected) and error.kind is rejection and error.advice
    assert stops_publishing(error) == (status in (401, 403, 409))
    # Nothing of the body beyond its code reaches the error (and so the log).
    assert CANARY not in str(error) and CREDENTIAL not in str(error)
    assert f"status={status}" in str(error) and "path=/api/v1/agent/heartbeat" in str(error)


async def test_a_replay_carries_the_server_cursor_and_is_not_fatal() -> None:
    client, _ = client_answering(
        409, error_body("sequence_replayed", stream="telemetry", cursor=41)
    )
    with pytest.raises(Conflict) as caught:
        await client.put_telemetry(telemetry())
    assert caught.value.cursor == 41 and not caught.value.fatal
    assert caught.value.method == "PUT" and caught.value.path == "/api/v1/agent/telemetry"


async def test_retry_after_and_unreadable_error_bodies() -> None:
    client, _ = client_answering(429, b"<html>busy</html>", {"Retry-After": "7"})
    with pytest.raises(Transient) as caught:
        await client.heartbeat(heartbeat())
    assert caught.value.retry_after_s == 7 and caught.value.code is None


async def test_an_unexpected_answer_does_not_echo_its_content() -> None:
    leaked = {"node_id": "not-a-uuid", "credential": CREDENTIAL}
    client, _ = client_answering(201, leaked)
    request = EnrollRequest(
        enrollment_token="mfe.x.y", protocol_version=1, agent_version="1", hostname="h"
    )
    with pytest.raises(Refused) as caught:
        await client.enroll(request)
    assert caught.value.failure_class is FailureClass.RESPONSE
    assert CREDENTIAL not in str(caught.value) and "node_id" in str(caught.value)


async def test_credentials_travel_only_in_the_authorization_header() -> None:
    client, seen = client_answering(
        200,
        {
            "node_id": str(NODE),
            "received_at": datetime.now(UTC).isoformat(),
            "heartbeat_interval_s": 10,
            "server_time": datetime.now(UTC).isoformat(),
        },
    )
    await client.heartbeat(heartbeat())
    assert seen[0].headers["authorization"] == f"Bearer {CREDENTIAL}"
    assert seen[0].headers["x-correlation-id"].startswith("agent-")
    assert CREDENTIAL.encode() not in seen[0].content
    client.credential = None
    with pytest.raises(Rejected) as caught:
        await client.heartbeat(heartbeat())
    assert caught.value.code is not None and caught.value.code.value == "credential_missing"
    assert len(seen) == 1  # nothing sent without a credential


# --- failure classes from real sockets -------------------------------------------------


@pytest.fixture
def silent_server() -> Iterator[int]:
    """Accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    server.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def classify(url: str, timeout_s: float = 2.0) -> Transient:
    async with make_http_client(url, timeout_s=timeout_s, trust_env=False) as http:
        with pytest.raises(Transient) as caught:
            await ProtocolClient(http, CREDENTIAL).heartbeat(heartbeat())
    assert caught.value.status is None
    return caught.value


async def test_transport_failures_are_classified(silent_server: int) -> None:
    refused = await classify(f"http://127.0.0.1:{free_port()}")
    assert refused.failure_class is FailureClass.REFUSED
    timeout = await classify(f"http://127.0.0.1:{silent_server}", timeout_s=0.3)
    assert timeout.failure_class is FailureClass.TIMEOUT
    dns = await classify("http://no-such-host.invalid")
    assert dns.failure_class is FailureClass.DNS
    # TLS spoken to a port that answers nothing: a handshake timeout is still a timeout.
    tls_silent = await classify(f"https://127.0.0.1:{silent_server}", timeout_s=0.3)
    assert tls_silent.failure_class is FailureClass.TIMEOUT
    for error in (refused, timeout, dns):
        assert CREDENTIAL not in str(error)


async def test_tls_to_a_plain_http_server_is_a_tls_failure() -> None:
    from http.server import BaseHTTPRequestHandler, HTTPServer

    server = HTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        error = await classify(f"https://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
    assert error.failure_class is FailureClass.TLS


# --- the retry policy -----------------------------------------------------------------


def flaky(failures: list[RequestFailed]) -> tuple[Callable[[], Any], list[int]]:
    calls: list[int] = []

    async def call() -> str:
        calls.append(1)
        if failures:
            raise failures.pop(0)
        return "ok"

    return call, calls


def transient(status: int | None = 503) -> Transient:
    return Transient(method="POST", path="/p", failure_class=FailureClass.HTTP, status=status)


async def test_transient_failures_are_retried_with_backoff() -> None:
    call, calls = flaky([transient(), transient(429), transient(None)])
    seen: list[RequestFailed] = []
    started = asyncio.get_running_loop().time()
    result = await retry_transient(
        "op", call, stop=asyncio.Event(), initial_s=0.01, max_s=0.05, on_failure=seen.append
    )
    assert result == "ok" and len(calls) == 4 and len(seen) == 3
    assert asyncio.get_running_loop().time() - started < 2


@pytest.mark.parametrize(
    "error",
    [
        Refused(method="PUT", path="/p", failure_class=FailureClass.HTTP, status=422),
        Rejected(method="PUT", path="/p", failure_class=FailureClass.HTTP, status=401),
        Conflict(method="PUT", path="/p", failure_class=FailureClass.HTTP, status=409),
    ],
)
async def test_other_failures_are_not_retried(error: RequestFailed) -> None:
    call, calls = flaky([error])
    with pytest.raises(type(error)):
        await retry_transient("op", call, stop=asyncio.Event(), initial_s=0.01, max_s=0.05)
    assert len(calls) == 1


async def test_a_stop_ends_retrying_without_another_attempt() -> None:
    call, calls = flaky([transient() for _ in range(100)])
    stop = asyncio.Event()
    sent_after_stop: list[bool] = []

    async def watched() -> Any:
        sent_after_stop.append(stop.is_set())
        return await call()

    loop = asyncio.get_running_loop()
    started = loop.time()
    loop.call_later(0.3, stop.set)
    with pytest.raises(Stopped):
        await retry_transient("op", watched, stop=stop, initial_s=5, max_s=5)
    # Full jitter may pick a wait under 0.3 s, so there can be a second attempt before the
    # stop; but the wait under way was cut short, and nothing was sent after the stop.
    assert loop.time() - started < 2
    assert calls and not any(sent_after_stop)


async def test_retries_of_one_call_are_bounded_by_max_attempts() -> None:
    call, calls = flaky([transient() for _ in range(10)])
    seen: list[RequestFailed] = []
    with pytest.raises(Transient):
        await retry_transient(
            "op",
            call,
            stop=asyncio.Event(),
            initial_s=0.01,
            max_s=0.02,
            on_failure=seen.append,
            max_attempts=3,
        )
    assert len(calls) == 3 and len(seen) == 3  # the last failure is raised, not retried


def test_the_backoff_grows_with_failures_in_a_row_up_to_its_cap() -> None:
    bounds = [
        max(backoff_s(failures, initial_s=1.0, max_s=30.0) for _ in range(200))
        for failures in (1, 3, 10_000)
    ]
    assert bounds[0] <= 1.0 < bounds[1] <= 4.0 < bounds[2] <= 30.0  # and no overflow


@pytest.mark.parametrize(
    ("status", "code", "final"),
    [
        (422, "validation_failed", True),
        (413, "body_too_large", True),
        (404, "not_found", True),
        (400, "a_code_from_a_newer_server", True),
        # A 409 stops the agent only for the codes that refuse every later payload too.
        (409, "state_conflict", True),
        (409, "a_code_from_a_newer_server", True),
        (409, "sequence_replayed", True),
        (409, "protocol_version_unsupported", False),
        (409, "node_terminal", False),
        (401, "credential_revoked", False),
        (403, "node_disabled", False),
        (503, "internal_error", False),
        (429, "internal_error", False),
    ],
)
async def test_which_refusals_are_final_for_their_payload_only(
    status: int, code: str, final: bool
) -> None:
    client, seen = client_answering(status, error_body(code))
    with pytest.raises(RequestFailed) as caught:
        await client.put_telemetry(telemetry())
    assert final_for_payload(caught.value) is final
    if final:
        assert not stops_publishing(caught.value)
    assert len(seen) == 1
