"""ops/bench/gateway.py's embeddings workload: requests/s through the gateway against the
direct llama-server (`--embeddings --pooling mean`), in the same run.

The load generator is wrk (ops/bench/wrk_load.py: C, epoll, one thread here, a Lua
script sending the one body), not the Python client the streamed workloads use: the
figure is a rate, and a Python generator on the same 2 cores would take CPU from both
sides and cap them alike. Per concurrency (wrk's connections), alternating rounds of
`duration` seconds (direct, gateway, gateway, direct); goal: gateway / direct >= 0.9.
Both answers are checked first: 8 embeddings each, base64 float32 of one width, the
same vectors within float noise.

The rate judged is the closed loop's, connections / mean latency (Little's law), beside
wrk's count (answered / round). At about 1 request/s a round of 20 s answers only 5 or
6 requests per connection, and wrk drops those in flight when it ends: its count moves
in steps of a sixth (a request 0.3 s longer at 4 connections turned 24 answers into 20,
a ratio of 0.83, where the latencies differed by 9 %). Both are printed.
"""

from __future__ import annotations

import array
import base64
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx
import wrk_load
from gateway_rounds import Direct
from gateway_workloads import Workload

GOAL_RATIO: Final = 0.9
# wrk's own 2 s counts a request of 8 inputs on a loaded box as an error.
WRK_TIMEOUT_S: Final = 60.0
# Float noise between two servers batching the same inputs differently.
TOLERANCE: Final = 1e-3


@dataclass
class Side:
    rounds: list[wrk_load.WrkSummary] = field(default_factory=list)
    cpu: float = 0.0

    def rate(self) -> float:
        """Answered requests/s, the rounds together (they last alike)."""
        return statistics.mean(r.throughput * (r.requests - r.errors) / r.requests
                               for r in self.rounds if r.requests)  # fmt: skip

    def answered(self) -> int:
        return sum(r.requests - r.errors for r in self.rounds)

    def errors(self) -> int:
        return sum(r.errors for r in self.rounds)

    def loop_rate(self, connections: int) -> float:
        """Requests/s of the closed loop: its connections over the mean latency of every
        answered request (the rounds weighted by their answers)."""
        answered = [(r.requests - r.errors, r.mean_s) for r in self.rounds]
        count = sum(n for n, _ in answered)
        if not count:
            return 0.0
        return connections / (sum(n * mean for n, mean in answered) / count)

    def p50_ms(self) -> float:
        return statistics.median(r.p50_s for r in self.rounds) * 1e3

    def p99_ms(self) -> float:
        return max(r.p99_s for r in self.rounds) * 1e3


def _vectors(answer: dict[str, Any]) -> list[list[float]]:
    vectors = []
    for item in sorted(answer["data"], key=lambda each: each["index"]):
        floats = array.array("f")
        floats.frombytes(base64.b64decode(item["embedding"]))
        vectors.append(list(floats))
    return vectors


def check(workload: Workload, targets: dict[str, tuple[str, dict[str, str], Any]]) -> int:
    """Both sides answer the body alike; the embeddings' width."""
    answers = {}
    with httpx.Client(timeout=120, trust_env=False) as client:
        for name, (url, headers, body) in targets.items():
            response = client.post(url, json=body, headers=headers)
            if response.status_code != 200:
                raise SystemExit(f"{name} embeddings: {response.status_code} {response.text}")
            answers[name] = _vectors(response.json())
    direct, gateway = answers["direct"], answers["gateway"]
    count = len(workload.gateway_body["input"])
    if len(direct) != count or len(gateway) != count:
        raise SystemExit(f"embeddings: {len(direct)} direct, {len(gateway)} gateway, not {count}")
    widths = {len(each) for each in direct + gateway}
    if len(widths) != 1:
        raise SystemExit(f"embeddings: widths {sorted(widths)} (direct and gateway differ)")
    pairs = zip(direct, gateway, strict=True)
    apart = max(abs(x - y) for a, b in pairs for x, y in zip(a, b, strict=True))
    if apart > TOLERANCE:
        # Said, not fatal: the rate is still the figure asked for.
        print(f"embeddings: the gateway's vectors differ from the direct ones by up to {apart:.3g}")
    return len(direct[0])


def measure(
    workload: Workload,
    urls: tuple[str, str, Direct],
    api_cpu: Callable[[], float],
    levels: list[int],
    duration_s: float,
    workdir: Path,
) -> tuple[int, list[tuple[int, Side, Side]]]:
    """(width, per concurrency: direct, gateway); `urls`: gateway, its secret, direct."""
    gateway, secret, direct = urls
    targets = {
        "direct": direct.target(workload.direct_path, workload.direct_body),
        "gateway": (
            f"{gateway}{workload.gateway_path}",
            {"Authorization": f"Bearer {secret}"},
            workload.gateway_body,
        ),
    }
    width = check(workload, targets)
    base = {"direct": direct.url, "gateway": gateway}
    paths = {"direct": workload.direct_path, "gateway": workload.gateway_path}
    # wrk's script puts each line's credential in a bearer header: the worker's key for
    # the deployment's own llama-server, none that a second one reads.
    bodies = {"direct": [(direct.key or "direct", workload.direct_body)],
              "gateway": [(secret, workload.gateway_body)]}  # fmt: skip
    rows = []
    for connections in levels:
        sides = {"direct": Side(), "gateway": Side()}
        for index in range(4):  # direct, gateway, gateway, direct
            name = ("direct", "gateway")[index in (1, 2)]
            before = api_cpu()
            summary = wrk_load.run(
                name, base[name], paths[name], bodies[name], duration_s=duration_s,
                connections=connections, workdir=workdir, threads=1, timeout_s=WRK_TIMEOUT_S,
            )  # fmt: skip
            sides[name].rounds.append(summary)
            sides[name].cpu += api_cpu() - before
        rows.append((connections, sides["direct"], sides["gateway"]))
    return width, rows


def report(figures: tuple[int, list[tuple[int, Side, Side]]], baseline: str) -> None:
    width, rows = figures
    print(f"workload embeddings: 8 inputs, base64, plain; baseline: {baseline}; "
          f"{width} floats each, both sides alike")  # fmt: skip
    print("load generator: wrk, 1 thread, Lua script (ops/bench/wrk_load.py); "
          f"goal: requests/s gateway / direct >= {GOAL_RATIO}, judged on the closed "
          "loop's rate (connections / mean latency; wrk's count beside it)")  # fmt: skip
    print(f"{'conc':>4} {'loop req/s d/g':>15} {'g/d':>6} {'wrk req/s d/g':>14} {'g/d':>6} "
          f"{'p50 d/g ms':>15} {'p99 d/g ms':>15} {'API cpu ms/req':>14} "
          f"{'err d/g':>7}")  # fmt: skip
    for connections, d, g in rows:
        loop_d, loop_g = d.loop_rate(connections), g.loop_rate(connections)
        ratio = loop_g / loop_d if loop_d else float("nan")
        counted = g.rate() / d.rate() if d.rate() else float("nan")
        cpu_ms = g.cpu / max(1, g.answered()) * 1000
        print(
            f"{connections:>4} {loop_d:>7.2f}/{loop_g:<7.2f} {ratio:>6.3f} "
            f"{d.rate():>6.2f}/{g.rate():<7.2f} {counted:>6.3f} "
            f"{d.p50_ms():>7.1f}/{g.p50_ms():<7.1f} {d.p99_ms():>7.1f}/{g.p99_ms():<7.1f} "
            f"{cpu_ms:>14.2f} {d.errors():>3}/{g.errors():<3} "
            f"{'ok' if ratio >= GOAL_RATIO else 'MISS'}"
        )
