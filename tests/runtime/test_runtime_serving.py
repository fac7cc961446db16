"""The runtime worker against a real llama-server and a real instruct model: readiness,
the local OpenAI-compatible endpoints (through the official client too), backpressure,
switching, crashes, the loopback binding and leftover servers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest

from agent.runtime.server import write_pidfile
from tests.agent.harness import wait_until
from tests.runtime.harness import RuntimeProcess, alive, chat, model_entry

StartRuntime = Callable[..., RuntimeProcess]


@pytest.fixture
def one_model(llama_server: Path, instruct_model: Path) -> dict[str, Any]:
    return {
        "llama_server_path": str(llama_server),
        "models": [model_entry("smol", instruct_model, roles=["planner"], alias=None)],
        "llama_server_probe_interval_s": 0.05,
        "llama_server_stop_grace_s": 5,
        "unload_settle_timeout_s": 2,
    }


def assert_serves(runtime: RuntimeProcess) -> None:
    """One token through the worker's local API (which loads the model if it must)."""
    with runtime.client() as http:
        assert http.post("/v1/chat/completions", json=chat("smol", max_tokens=1)).status_code == 200


def test_the_official_client_chats_and_streams(
    runtimes: StartRuntime, one_model: dict[str, Any]
) -> None:
    runtime = runtimes(**one_model)
    client = openai.OpenAI(base_url=f"{runtime.url}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list()] == ["smol"]
    answer = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "Say hello."}], max_tokens=8
    )
    assert answer.choices[0].message.content
    assert answer.usage is not None and answer.usage.completion_tokens > 0
    stream = client.chat.completions.create(
        model="smol",
        messages=[{"role": "user", "content": "Count to five."}],
        max_tokens=16,
        stream=True,
    )
    pieces = [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
    assert len(pieces) > 1 and "".join(pieces)
    inventory = runtime.inventory()
    assert inventory["loaded_models"] == ["smol"]
    [device] = inventory["devices"]
    assert device["device_id"] == "cpu" and device["loaded_model"] == "smol"
    with runtime.client() as http:
        registration = http.get("/v1/node/registration").json()
    assert registration["served_models"] == [{"model_id": "smol", "roles": ["planner"]}]


def test_bad_requests_get_openai_shaped_errors(
    runtimes: StartRuntime, one_model: dict[str, Any]
) -> None:
    runtime = runtimes(**one_model)
    with runtime.client() as http:
        unknown = http.post("/v1/chat/completions", json=chat("nope"))
        assert unknown.status_code == 404
        assert unknown.json()["error"]["code"] == "model_not_found"
        broken = http.post("/v1/chat/completions", content=b"{not json")
        assert broken.status_code == 400 and broken.json()["error"]["code"] == "invalid_json"
        # Python's json parser recurses: this raised RecursionError, a 500.
        nested = http.post("/v1/chat/completions", content=b"[" * 100_000 + b"]" * 100_000)
        assert nested.status_code == 400 and nested.json()["error"]["code"] == "invalid_json"
        huge = http.post("/v1/chat/completions", content=b" " * (17 * 1024 * 1024))
        assert huge.status_code == 413 and huge.json()["error"]["code"] == "body_too_large"
        # The worker still serves.
        assert http.post("/v1/chat/completions", json=chat("smol", max_tokens=1)).status_code == 200


def test_llama_server_listens_on_loopback_only(
    runtimes: StartRuntime, one_model: dict[str, Any]
) -> None:
    runtime = runtimes(**one_model)
    assert_serves(runtime)
    pid = runtime.server_pid()
    assert pid is not None
    listening = [
        c.laddr
        for c in psutil.Process(pid).net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    ]
    assert listening and all(address.ip == "127.0.0.1" for address in listening), listening


def test_only_the_worker_may_call_its_llama_server(
    runtimes: StartRuntime, one_model: dict[str, Any]
) -> None:
    # Loopback is shared by every local process of the node: one that finds the port
    # must not chat past the worker's backpressure or read the slots' prompts.
    runtime = runtimes(**one_model)
    assert_serves(runtime)
    pidfile = runtime.run_dir / "llama-server-cpu.json"
    direct = f"http://127.0.0.1:{json.loads(pidfile.read_text())['port']}"
    key_file = runtime.run_dir / "llama-server-cpu.key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    key = key_file.read_text()
    assert key not in " ".join(psutil.Process(runtime.server_pid()).cmdline())
    for path, body in (("/v1/chat/completions", chat("smol", max_tokens=1)), ("/slots", None)):
        method = "POST" if body is not None else "GET"
        refused = httpx.request(method, f"{direct}{path}", json=body, timeout=30)
        assert refused.status_code == 401, (path, refused.status_code)
        wrong = httpx.request(
            method, f"{direct}{path}", json=body, headers={"Authorization": "Bearer x"}, timeout=30
        )
        assert wrong.status_code == 401, (path, wrong.status_code)
    assert_serves(runtime)


def test_past_the_startup_timeout_the_request_gets_503_with_retry_after(
    runtimes: StartRuntime, one_model: dict[str, Any]
) -> None:
    # Far below the real load time (~0.3 s), with no room to extend it.
    runtime = runtimes(
        **one_model, llama_server_startup_timeout_s=0.01, llama_server_startup_cap_s=0.02
    )
    with runtime.client() as http:
        response = http.post("/v1/chat/completions", json=chat("smol", max_tokens=1))
    assert response.status_code == 503, response.text
    assert response.headers["Retry-After"]
    assert response.json()["error"]["code"] == "startup_timeout"
    assert "Loading model" not in response.text
    # The half-started server was stopped, not left behind.
    assert runtime.server_pid() is None


def test_a_killed_server_shows_in_health_and_the_next_request_restarts_it(
    runtimes: StartRuntime, one_model: dict[str, Any]
) -> None:
    runtime = runtimes(**one_model)
    assert_serves(runtime)
    first = runtime.server_pid()
    assert first is not None
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: not alive(first), 10, "the server to die")
    assert runtime.inventory()["devices"][0]["loaded_model"] is None
    assert_serves(runtime)
    second = runtime.server_pid()
    assert second is not None and second != first


async def _timed(client: httpx.AsyncClient, body: dict[str, Any]) -> tuple[int, float]:
    response = await client.post("/v1/chat/completions", json=body)
    return response.status_code, time.monotonic()


def test_one_request_past_the_bound_gets_429_and_the_rest_are_served_in_order(
    runtimes: StartRuntime, one_model: dict[str, Any]
) -> None:
    runtime = runtimes(**one_model, max_pending_requests_per_device=3)
    assert_serves(runtime)  # loaded before the race

    async def race() -> list[tuple[int, float]]:
        async with httpx.AsyncClient(base_url=runtime.url, timeout=120) as client:
            tasks = []
            for index in range(4):
                body = chat("smol", f"Request {index}: write a long story.", max_tokens=48)
                tasks.append(asyncio.create_task(_timed(client, body)))
                await asyncio.sleep(0.05)  # arrival order is send order
            return list(await asyncio.gather(*tasks))

    results = asyncio.run(race())
    statuses = [status for status, _ in results]
    assert statuses == [200, 200, 200, 429], statuses
    finished = [at for status, at in results if status == 200]
    assert finished == sorted(finished), "served in arrival order"


def test_a_switch_waits_for_the_request_in_flight(
    runtimes: StartRuntime, llama_server: Path, instruct_model: Path
) -> None:
    runtime = runtimes(
        llama_server_path=str(llama_server),
        models=[
            model_entry("first", instruct_model),
            model_entry("second", instruct_model, ctx_size=256),
        ],
        llama_server_probe_interval_s=0.05,
    )

    async def scenario() -> tuple[list[str], int, float, float]:
        async with httpx.AsyncClient(base_url=runtime.url, timeout=120) as client:
            body = chat("first", "Write a long story about a lighthouse.", max_tokens=64)
            body["stream"] = True
            lines: list[str] = []
            started = asyncio.Event()

            async def stream_first() -> float:
                async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                    assert r.status_code == 200
                    async for line in r.aiter_lines():
                        started.set()
                        if line:
                            lines.append(line)
                return time.monotonic()

            first = asyncio.create_task(stream_first())
            await asyncio.wait_for(started.wait(), 60)
            status, second_done = await _timed(client, chat("second", max_tokens=1))
            return lines, status, await first, second_done

    lines, status, first_done, second_done = asyncio.run(scenario())
    assert lines[-1] == "data: [DONE]", "the request in flight finished whole"
    assert status == 200
    assert second_done > first_done
    assert runtime.inventory()["loaded_models"] == ["second"]
    assert "switch" in runtime.output


def test_a_leftover_server_is_reaped_when_the_worker_starts(
    runtimes: StartRuntime, one_model: dict[str, Any], llama_server: Path, instruct_model: Path
) -> None:
    """A server whose worker died without taking it along (its parent-death signal is
    Linux's; an earlier version had none) is found by its pidfile and stopped."""
    runtime = runtimes(**one_model)
    runtime.stop()
    argv = [str(llama_server), "--model", str(instruct_model), "--host", "127.0.0.1",
            "--port", "0", "--ctx-size", "256", "--threads", "1"]  # fmt: skip
    orphan = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              process_group=0)  # fmt: skip
    try:
        write_pidfile(runtime.run_dir / "llama-server-cpu.json", orphan.pid, llama_server, 0)
        runtime.start()
        wait_until(lambda: orphan.poll() is not None, 15, "the leftover server to be reaped")
        assert "reaped a leftover llama-server" in runtime.output
    finally:
        orphan.kill()
        orphan.wait(timeout=10)


def test_an_unsupported_backend_is_one_clear_line(
    runtimes: StartRuntime, one_model: dict[str, Any]
) -> None:
    runtime = runtimes(**one_model, backends=["metal"], wait=False)
    assert runtime.proc is not None
    assert runtime.proc.wait(timeout=30) == 1
    assert "'metal' is not supported by this build" in runtime.output
    assert "Traceback" not in runtime.output


def test_sigterm_stops_the_servers_too(runtimes: StartRuntime, one_model: dict[str, Any]) -> None:
    runtime = runtimes(**one_model)
    assert_serves(runtime)
    pid = runtime.server_pid()
    assert pid is not None
    assert runtime.stop() == 0
    assert not alive(pid)


def _throttle_load(runtime: RuntimeProcess, stop: asyncio.Event) -> Callable[[], Any]:
    """Slow the next llama-server's load down without stopping its progress: it runs
    for 30 ms out of every 180 (SIGSTOP/SIGCONT), until `stop` is set."""

    async def throttle() -> None:
        pid = None
        while pid is None and not stop.is_set():
            pid = runtime.server_pid()
            await asyncio.sleep(0.005)
        while pid is not None and not stop.is_set():
            try:
                os.kill(pid, signal.SIGSTOP)
                await asyncio.sleep(0.15)
                os.kill(pid, signal.SIGCONT)
                await asyncio.sleep(0.03)
            except ProcessLookupError:
                return
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    return throttle


async def _slow_load(runtime: RuntimeProcess) -> tuple[int, str, float]:
    stop = asyncio.Event()
    throttle = asyncio.create_task(_throttle_load(runtime, stop)())
    started = time.monotonic()
    try:
        async with httpx.AsyncClient(base_url=runtime.url, timeout=120) as client:
            response = await client.post("/v1/chat/completions", json=chat("smol", max_tokens=1))
    finally:
        stop.set()
        await throttle
    return response.status_code, response.text, time.monotonic() - started


@pytest.mark.parametrize("progress_aware", [True, False], ids=["progress-aware", "fixed"])
def test_a_slow_but_progressing_load_is_not_killed(
    runtimes: StartRuntime, one_model: dict[str, Any], progress_aware: bool
) -> None:
    # The same slowed load under the same timeout: with the log's progress resetting
    # it (cap far away) it completes; with the cap at the timeout it cannot.
    timeout_s = 0.6
    runtime = runtimes(
        **one_model,
        llama_server_startup_timeout_s=timeout_s,
        llama_server_startup_cap_s=60 if progress_aware else timeout_s,
    )
    status, text, took = asyncio.run(_slow_load(runtime))
    if progress_aware:
        assert status == 200, text
        assert took > timeout_s, "the load really took longer than the timeout"
    else:
        assert status == 503 and "startup_timeout" in text, text
