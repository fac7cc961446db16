"""RoleMesh compatibility: a runtime worker with `dispatcher_base_url` registers with the
dispatcher and heartbeats it, and registers again once the dispatcher forgets it. The
dispatcher is a real HTTP server on loopback that records what it is sent."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from schemas.runtime_local import DISPATCHER_HEARTBEAT, DISPATCHER_REGISTER
from tests.agent.harness import wait_until
from tests.runtime.harness import RuntimeProcess, model_entry


class Dispatcher:
    def __init__(self) -> None:
        self.received: list[tuple[str, dict[str, Any]]] = []
        self.forget = threading.Event()
        dispatcher = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                dispatcher.received.append((self.path, body))
                status = 200
                if self.path == DISPATCHER_HEARTBEAT and dispatcher.forget.is_set():
                    dispatcher.forget.clear()
                    status = 404
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def paths(self) -> list[str]:
        return [path for path, _ in self.received]


@pytest.fixture
def dispatcher() -> Iterator[Dispatcher]:
    running = Dispatcher()
    yield running
    running.server.shutdown()


def test_register_heartbeat_and_register_again(
    runtimes: Callable[..., RuntimeProcess],
    dispatcher: Dispatcher,
    llama_server: Path,
    instruct_model: Path,
) -> None:
    runtime = runtimes(
        llama_server_path=str(llama_server),
        models=[model_entry("smol", instruct_model, roles=["planner", "coder"])],
        dispatcher_base_url=dispatcher.url,
        dispatcher_heartbeat_interval_s=0.2,
        node_name="rolemesh-node",
        trust_env=False,
    )
    wait_until(lambda: dispatcher.paths().count(DISPATCHER_HEARTBEAT) >= 2, 15, "heartbeats")
    path, registration = dispatcher.received[0]
    assert path == DISPATCHER_REGISTER
    assert registration["node_id"] == "rolemesh-node"
    assert registration["base_url"] == runtime.url
    assert registration["served_models"] == [{"model_id": "smol", "roles": ["planner", "coder"]}]
    with runtime.client() as http:
        shown = http.get("/v1/node/registration").json()
    # The exact payload the node sends (device metrics move between the two).
    assert {k: v for k, v in shown.items() if k != "devices"} == {
        k: v for k, v in registration.items() if k != "devices"
    }
    assert [d["device_id"] for d in shown["devices"]] == ["cpu"]
    heartbeat = next(body for path, body in dispatcher.received if path == DISPATCHER_HEARTBEAT)
    assert heartbeat["node_id"] == "rolemesh-node"
    assert heartbeat["devices"][0]["memory_total_bytes"] > 0
    dispatcher.forget.set()
    seen = len(dispatcher.received)
    wait_until(
        lambda: DISPATCHER_REGISTER in dispatcher.paths()[seen:], 15, "a second registration"
    )
    assert "registering with a dispatcher while listening on 127.0.0.1" in runtime.output
