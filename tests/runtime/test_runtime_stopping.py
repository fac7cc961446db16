"""The runtime worker lets go of its device and of its llama-servers, against a real
llama-server: a client that leaves (streamed or not) cancels its request upstream at
once; SIGTERM stops within a bounded grace and takes every llama-server with it; a
SIGKILLed worker's llama-server dies with it; requests get a bounded `max_tokens`."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.agent.harness import wait_until
from tests.runtime.harness import RuntimeProcess, alive, chat, model_entry

StartRuntime = Callable[..., RuntimeProcess]
# Far more tokens than any bound below allows to generate: a request that is not
# cancelled keeps the device for minutes (ignore_eos: the model never stops by itself).
LONG = 6000


@pytest.fixture
def long_context(llama_server: Path, instruct_model: Path) -> dict[str, Any]:
    return {
        "llama_server_path": str(llama_server),
        "models": [model_entry("smol", instruct_model, ctx_size=LONG + 256)],
        "llama_server_probe_interval_s": 0.05,
        "llama_server_stop_grace_s": 5,
        "max_tokens_ceiling": LONG,
    }


def long_request(stream: bool = False) -> bytes:
    body = json.dumps(chat("smol", "Write a very long story.", max_tokens=LONG,
                           ignore_eos=True, stream=stream)).encode()  # fmt: skip
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def generating_now(server: psutil.Process) -> bool:
    """Its CPU time moves over a sample of 0.5 s (generating uses a core; idle, none)."""
    before = sum(server.cpu_times()[:2])
    time.sleep(0.5)  # a sample of its CPU time, not a wait for a condition
    return sum(server.cpu_times()[:2]) - before > 0.1


def generating(runtime: RuntimeProcess) -> bool:
    """The device is held and its llama-server is busy."""
    if runtime.inventory()["devices"][0]["queue_depth"] < 1:
        return False
    pid = runtime.server_pid()
    return pid is not None and generating_now(psutil.Process(pid))


def one_token_within(runtime: RuntimeProcess, bound_s: float) -> float:
    started = time.monotonic()
    with runtime.client(timeout=bound_s) as http:
        answer = http.post("/v1/chat/completions", json=chat("smol", max_tokens=1))
    assert answer.status_code == 200, answer.text
    return time.monotonic() - started


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_client_that_leaves_frees_the_device_at_once(
    runtimes: StartRuntime, long_context: dict[str, Any], stream: bool
) -> None:
    runtime = runtimes(**long_context)
    one_token_within(runtime, 120)  # the model is loaded
    client = socket.create_connection(("127.0.0.1", runtime.port))
    client.sendall(long_request(stream))
    wait_until(lambda: generating(runtime), 30, "the long request generating")
    client.close()
    # The device is free as soon as llama-server has seen the request go: the queue
    # empties, and a one-token request does not wait for thousands of tokens.
    wait_until(lambda: runtime.inventory()["devices"][0]["queue_depth"] == 0, 10,
               "the abandoned request to leave the device")  # fmt: skip
    assert one_token_within(runtime, 20) < 20
    # And llama-server itself stopped generating: its CPU time stands still over a
    # window (a one-token request takes a fraction of the sample).
    server = psutil.Process(runtime.server_pid() or -1)
    wait_until(lambda: not generating_now(server), 10, "llama-server idle")


def test_sigterm_ends_requests_in_flight_within_the_grace_and_stops_llama_server(
    runtimes: StartRuntime, long_context: dict[str, Any]
) -> None:
    """A stream holds the device and a plain request waits behind it; SIGTERM: after
    the grace the stream ends with an error event, the waiting request gets 503 (no
    server is started again for it), llama-server is stopped, the worker exits."""
    runtime = runtimes(**long_context, shutdown_grace_s=2)
    one_token_within(runtime, 120)
    server = runtime.server_pid()
    assert server is not None
    streamed = socket.create_connection(("127.0.0.1", runtime.port))
    streamed.sendall(long_request(stream=True))
    wait_until(lambda: generating(runtime), 30, "the long stream generating")
    answers: dict[str, httpx.Response] = {}

    def waiting() -> None:
        with runtime.client(timeout=120) as http:
            answers["waiting"] = http.post("/v1/chat/completions", json=chat("smol", max_tokens=8))

    caller = threading.Thread(target=waiting)
    caller.start()
    wait_until(lambda: runtime.inventory()["devices"][0]["queue_depth"] == 2, 30, "the queue")
    assert runtime.proc is not None
    started = time.monotonic()
    runtime.proc.send_signal(signal.SIGTERM)
    assert runtime.proc.wait(timeout=60) == 0, runtime.output[-3000:]
    stopped_in = time.monotonic() - started
    caller.join(timeout=30)
    # Within the grace (2 s) and the server's own stop, not after the 6,000 tokens.
    assert stopped_in < 15, stopped_in
    streamed.settimeout(10)
    received = b""
    while chunk := streamed.recv(1 << 16):
        received += chunk
    assert b'"code": "upstream_unavailable"' in received, received[-500:]
    answer = answers["waiting"]
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] in ("stopping", "upstream_unavailable")
    assert not alive(server), "llama-server was stopped with the worker"
    # Started once, for the first request: none for the one that waited.
    assert runtime.output.count("llama-server for smol on cpu started") == 1


def test_a_sigkilled_worker_takes_its_llama_server_with_it(
    runtimes: StartRuntime, long_context: dict[str, Any]
) -> None:
    runtime = runtimes(**long_context)
    one_token_within(runtime, 120)
    server = runtime.server_pid()
    assert server is not None and alive(server)
    runtime.kill()
    wait_until(lambda: not alive(server), 10, "llama-server to die with its worker")


def test_max_tokens_has_a_default_and_a_ceiling(
    runtimes: StartRuntime, long_context: dict[str, Any]
) -> None:
    runtime = runtimes(**{**long_context, "default_max_tokens": 3, "max_tokens_ceiling": 64})
    with runtime.client(timeout=120) as http:
        story = chat("smol", "Write a long story.", ignore_eos=True)
        unbounded = http.post("/v1/chat/completions", json=story)
        assert unbounded.status_code == 200, unbounded.text
        assert unbounded.json()["usage"]["completion_tokens"] == 3
        for value in (65, -1, 0, "8", True):
            over = http.post("/v1/chat/completions", json=chat("smol", max_tokens=value))
            assert over.status_code == 400, (value, over.text)
            assert over.json()["error"]["code"] == "max_tokens_too_large"
        # Every key llama-server takes its bound from: n_predict first of all.
        for key in ("max_completion_tokens", "n_predict"):
            body = {**chat("smol", max_tokens=2), key: 100}
            over = http.post("/v1/chat/completions", json=body)
            assert over.status_code == 400, (key, over.text)
        within = http.post("/v1/chat/completions",
                           json=chat("smol", max_tokens=2, ignore_eos=True))  # fmt: skip
        assert within.json()["usage"]["completion_tokens"] == 2
