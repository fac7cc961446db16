"""How fast the runtime worker lets go of its device and of its llama-server.

    python ops/bench/release.py [--rounds 3 --grace 2]

A real runtime worker (one cpu device, SmolLM2-135M-Instruct) with a request of 6,000
tokens that never stops by itself (ignore_eos):

* **disconnect**: the client closes its connection while the answer is being generated;
  measured from the close until a one-token request has its answer (the device free
  again). A streamed client (which Starlette always cancelled) is the baseline measured
  in the same run; the ratio plain ÷ streamed is the figure (1.0: a plain client that
  leaves frees the device as fast as a streamed one).
* **stop**: SIGTERM with the long request in flight and `shutdown_grace_s` = --grace,
  against SIGTERM of an idle worker (the baseline): until the process has exited, and
  whether its llama-server is gone. The in-flight figure should be about the grace
  plus the idle one, never the length of the request.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
from stack.ports import free_port  # noqa: E402

LONG = 6000


def built(*flags: str) -> Path:
    result = subprocess.run(
        [sys.executable, str(ROOT / "ops/llama/build.py"), *flags],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return Path(result.stdout.strip().splitlines()[-1])


class Worker:
    def __init__(self, workdir: Path, binary: Path, model: Path, grace_s: float) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.run_dir = workdir / "run"
        config = {
            "llama_server_path": str(binary), "run_dir": str(self.run_dir),
            "listen_port": self.port, "log_level": "WARNING", "shutdown_grace_s": grace_s,
            "max_tokens_ceiling": LONG, "llama_server_probe_interval_s": 0.02,
            "models": [{"model_id": "m", "path": str(model), "threads": 2,
                        "ctx_size": LONG + 256}],
        }  # fmt: skip
        (workdir / "runtime.yaml").write_text(yaml.safe_dump(config))
        argv = [sys.executable, "-m", "cli.main", "runtime", "--config"]
        self.proc = subprocess.Popen(
            [*argv, str(workdir / "runtime.yaml")],
            cwd=ROOT, stdout=(workdir / "runtime.log").open("wb"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        until(lambda: self.get("/healthz") == 200, 30, "the worker")
        self.one_token()  # loads the model

    def get(self, path: str) -> int | None:
        try:
            return httpx.get(self.url + path, timeout=2, trust_env=False).status_code
        except httpx.HTTPError:
            return None

    def queue(self) -> int:
        inventory = httpx.get(self.url + "/v1/node/inventory", timeout=5, trust_env=False)
        depth: int = inventory.json()["devices"][0]["queue_depth"]
        return depth

    def server(self) -> psutil.Process:
        record = json.loads((self.run_dir / "llama-server-cpu.json").read_text())
        return psutil.Process(int(record["pid"]))

    def one_token(self) -> None:
        body = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
        answer = httpx.post(self.url + "/v1/chat/completions", json=body, timeout=600,
                            trust_env=False)  # fmt: skip
        answer.raise_for_status()

    def long_request(self, stream: bool) -> socket.socket:
        story = [{"role": "user", "content": "A long story."}]
        body = json.dumps({"model": "m", "max_tokens": LONG, "ignore_eos": True,
                           "stream": stream, "messages": story}).encode()  # fmt: skip
        client = socket.create_connection(("127.0.0.1", self.port))
        client.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        until(lambda: self.queue() >= 1, 30, "the long request to hold the device")
        server, before = self.server(), self.server().cpu_times().user
        until(lambda: server.cpu_times().user - before > 0.5, 30, "the long request generating")
        return client

    def stop(self) -> float:
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=600)
        return time.monotonic() - started


def until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)


def disconnect_s(worker: Worker, stream: bool) -> float:
    client = worker.long_request(stream)
    client.close()
    started = time.monotonic()
    worker.one_token()
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--grace", type=float, default=2.0)
    args = parser.parse_args()
    binary, model = built(), built("--model")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        (workdir / "a").mkdir()
        worker = Worker(workdir / "a", binary, model, args.grace)
        plain, streamed = [], []
        for _ in range(args.rounds):  # alternating, so drift touches both alike
            plain.append(disconnect_s(worker, stream=False))
            streamed.append(disconnect_s(worker, stream=True))
        idle = worker.stop()
        (workdir / "b").mkdir()
        busy_worker = Worker(workdir / "b", binary, model, args.grace)
        server = busy_worker.server()
        client = busy_worker.long_request(stream=False)  # kept open: the request in flight
        busy = busy_worker.stop()
        client.close()
        gone = not server.is_running() or server.status() == psutil.STATUS_ZOMBIE
    p, s = statistics.median(plain), statistics.median(streamed)
    print(f"disconnect -> device free: plain p50 {p * 1000:.0f} ms, streamed (baseline) "
          f"p50 {s * 1000:.0f} ms, ratio {p / s:.2f}x")  # fmt: skip
    print(f"SIGTERM -> exit: idle (baseline) {idle:.2f} s, a {LONG}-token request in flight "
          f"{busy:.2f} s with a {args.grace:g} s grace; its llama-server gone: {gone}")  # fmt: skip


if __name__ == "__main__":
    main()
