"""The runtime worker's local proxy against llama-server itself, and model-switch time.

    python ops/bench/runtime.py [--duration 15 --rounds 2]

A real runtime worker (`modelforge runtime`, one cpu device) in front of the real
llama-server (ops/llama/build.py) with SmolLM2-135M-Instruct. wrk (one connection: the
device serves one request at a time) POSTs the same one-token chat completion to the
worker and to its llama-server directly, in alternating rounds; the overhead is the
difference of the medians of p50 (goal < 2 ms). Then: requests alternating between two
models on the one device, each a switch by restart, against the same requests without
switching (`switch` = the difference of the medians).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import wrk_load  # noqa: E402  (sibling bench module)

from stack.ports import free_port  # noqa: E402


def _built(*flags: str) -> Path:
    result = subprocess.run(
        [sys.executable, str(ROOT / "ops/llama/build.py"), *flags],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return Path(result.stdout.strip().splitlines()[-1])


def _start(workdir: Path, binary: Path, model: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    entry = {"path": str(model), "threads": 2, "ctx_size": 512}
    config = {
        "llama_server_path": str(binary), "run_dir": str(workdir / "run"), "listen_port": port,
        "models": [{"model_id": "a", **entry}, {"model_id": "b", **entry, "ctx_size": 256}],
        "llama_server_probe_interval_s": 0.02, "log_level": "WARNING",
    }  # fmt: skip
    (workdir / "runtime.yaml").write_text(yaml.safe_dump(config))
    log = (workdir / "runtime.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "runtime", "--config", str(workdir / "runtime.yaml")],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"the runtime worker did not start; see {workdir / 'runtime.log'}")


def _body(model: str) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "Reply with OK."}],
            "max_tokens": 1, "temperature": 0}  # fmt: skip


def _switches(url: str, count: int) -> tuple[float, float]:
    """Median latency of requests that each switch model, and of ones that do not."""
    switching, staying = [], []
    with httpx.Client(base_url=url, timeout=120) as client:
        for index in range(count):
            started = time.perf_counter()
            response = client.post("/v1/chat/completions", json=_body("ab"[index % 2]))
            switching.append(time.perf_counter() - started)
            response.raise_for_status()
        for _ in range(count):
            started = time.perf_counter()
            client.post("/v1/chat/completions", json=_body("b")).raise_for_status()
            staying.append(time.perf_counter() - started)
    return statistics.median(switching), statistics.median(staying)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per wrk round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--switches", type=int, default=10)
    args = parser.parse_args()
    if not wrk_load.available():
        raise SystemExit("wrk is required: apt-get install wrk")
    binary, model = _built(), _built("--model")
    with tempfile.TemporaryDirectory(prefix="mf-bench-runtime-") as scratch:
        workdir = Path(scratch)
        proc, url = _start(workdir, binary, model)
        try:
            httpx.post(f"{url}/v1/chat/completions", json=_body("a"), timeout=120)
            record = json.loads((workdir / "run" / "llama-server-cpu.json").read_text())
            direct_url = f"http://127.0.0.1:{record['port']}"
            runs: dict[str, list[wrk_load.WrkSummary]] = {"direct": [], "proxy": []}
            for _ in range(args.rounds):
                for name, base in (("direct", direct_url), ("proxy", url)):
                    runs[name].append(
                        wrk_load.run(
                            name, base, "/v1/chat/completions", [("unused", _body("a"))],
                            duration_s=args.duration, connections=1, threads=1,
                            workdir=workdir,
                        )
                    )  # fmt: skip
                    print(runs[name][-1].line(), flush=True)
            p50 = {n: statistics.median(r.p50_s for r in rs) for n, rs in runs.items()}
            p99 = {n: statistics.median(r.p99_s for r in rs) for n, rs in runs.items()}
            print(
                f"proxy overhead: p50 {(p50['proxy'] - p50['direct']) * 1e3:+.2f} ms"
                f" ({p50['proxy'] / p50['direct']:.3f}x), p99"
                f" {(p99['proxy'] - p99['direct']) * 1e3:+.2f} ms"
                f" ({p99['proxy'] / p99['direct']:.3f}x) over {args.rounds} rounds"
            )
            switching, staying = _switches(url, args.switches)
            print(
                f"model switch (restart + readiness + warm-up): {(switching - staying):.3f} s"
                f" (a switching request {switching:.3f} s, a staying one {staying:.3f} s;"
                f" medians of {args.switches})"
            )
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
