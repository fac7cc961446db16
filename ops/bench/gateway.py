"""The gateway against calling the same llama-server directly, in the same run.

    python ops/bench/gateway.py [--workload chat|tools|json_schema|embeddings]
                                [--requests 40 --concurrency 1,4,16 --duration 5]
                                [--open-loads 0.5,0.8]
                                [--threads N --token-gap-s S --no-pin]

By default both llama-servers run on the last core alone and everything else on the
others (ops/bench/pinning.py: in production the node and the control plane are
different machines), with as many llama threads as they have cores. --no-pin shares
all cores; on a shared 2-core box then --threads 1 (two llama threads wait on each
other's barrier when other work holds a core). --token-gap-s 300: a stalled stream is
not the figure. Both sides get the same flags.

All real, on loopback: `modelforge up` in a temp data dir (tests/up_process.py), a
Hub-layout server with the cached SmolLM2 GGUF (tests/hub_server.py), an agent that
acquires it through an artifact job and a runtime worker beside it
(tests/runtime/probing.py), a profile (ctx_size 2048, threads 2, parallel 4), a
deployment `smol` (max_concurrent 64, so llama-server queues on both paths) and a
service client. The direct baseline is the deployment's own llama-server, called on its
loopback port with the key its worker gave it (the same process both ways: the same
prompt cache, the same partial tool-call parser); `--baseline second` starts a second
plain one with the same model and flags (`--parallel 4 -c 2048 -t 2`) instead, as the
figures before 2026-12-06 were measured.

Streaming chat completions (max_tokens 16, temperature 0, one fixed prompt) with httpx
async clients, N requests per round at each concurrency, alternating direct and gateway
rounds (2 each); with --open-loads, open-loop rounds after them (Poisson arrivals at
that fraction of the direct side's best closed-loop rate, the same times both ways:
ops/bench/gateway_rounds.py says why). Per row: TTFT p50/p99 both ways and the added
ms, streamed tokens/s (content chunks over the round's wall time; tokens per request printed too)
gateway / direct, invokes/s both ways, and the API process's CPU seconds per invoke
(psutil, gateway rounds; its background CPU during direct rounds printed beside it).
Goals: added TTFT p50 < 10 ms, p99 < 30 ms, tokens/s ratio >= 0.95.

Issue 34's workloads (ops/bench/gateway_workloads.py: the deployment, the direct
server's argv and both bodies, the same request reaching llama-server both ways):
`tools` (one tool, tool_choice required, the worker's prefill on the shipped
chatml-tools template, max_tokens 32, streamed; the first `delta.tool_calls` is the first
token) and `json_schema` (a 3-property object, streamed): the same rounds and table,
judged on added TTFT only (p50 <= 10 ms, p99 <= 30 ms); json_schema then times the
widest schema the bounds allow once each way (grammar cost). `embeddings` (8 inputs, base64,
plain): requests/s through the gateway / direct with wrk, goal >= 0.9
(ops/bench/gateway_embeddings.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx
import psutil
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))  # tests.*: the processes and flows reused here
import gateway_embeddings  # noqa: E402  (sibling bench modules)
import gateway_workloads  # noqa: E402
import pinning  # noqa: E402
import runtime as runtime_bench  # noqa: E402  (_built)
import wrk_load  # noqa: E402
from gateway_rounds import (  # noqa: E402
    LATE_S,
    LONG_GC_S,
    Direct,
    Side,
    Target,
    arrivals,
    pct,
    run_open,
    run_round,
    stalls,
)
from gateway_workloads import Workload  # noqa: E402

from schemas.protocol import (  # noqa: E402
    DEPLOYMENTS,
    RUNTIME_PROFILES,
    SERVICE_CLIENTS,
)
from schemas.stack import OPERATOR_KEY_FILE  # noqa: E402
from stack.ports import free_port  # noqa: E402
from tests.agent.harness import AgentProcess, wait_until  # noqa: E402
from tests.api_server import RunningApi  # noqa: E402
from tests.hub_server import HubServer  # noqa: E402
from tests.runtime.harness import RuntimeProcess  # noqa: E402
from tests.runtime.probing import COMMIT, GGUF, REPO, ProbeNode, node_with_model  # noqa: E402
from tests.up_process import UpProcess, child_pid  # noqa: E402

MODEL = gateway_workloads.MODEL
MAX_TOKENS = 16
PROMPT = [{"role": "user", "content": "Count from one to twenty in words."}]
CHAT_BODY = {"model": MODEL, "messages": PROMPT, "max_tokens": MAX_TOKENS,
             "temperature": 0, "stream": True}  # fmt: skip
GOAL_P50_MS, GOAL_P99_MS, GOAL_RATIO = 10.0, 30.0, 0.95
GRAMMAR_REQUESTS = 3
# The node at the cadence it has in production (the agent's and runtime worker's
# defaults), not the tests' (see Stack.start_agent).
REAL_CADENCE_AGENT = {"job_poll_interval_s": 5.0, "telemetry_interval_s": 15.0,
                      "inventory_check_interval_s": 30.0, "log_level": "INFO"}  # fmt: skip
REAL_CADENCE_RUNTIME = {"report_interval_s": 30.0}


class StackApi:
    """What the tests' flows use of RunningApi, for the API that `up` runs."""

    def __init__(self, base_url: str, key: str) -> None:
        self.base_url = base_url
        self.key = key

    @property
    def admin_headers(self) -> dict[str, str]:
        return {"X-ModelForge-Admin-Token": self.key}

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=30, trust_env=False, **kwargs)

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        with self.client() as client:
            response = client.post(path, json=body, headers=self.admin_headers)
        if response.status_code not in (200, 201):
            raise SystemExit(f"POST {path}: {response.status_code} {response.text}")
        answer: dict[str, Any] = response.json()
        return answer

    def get(self, path: str) -> dict[str, Any]:
        with self.client() as client:
            response = client.get(path, headers=self.admin_headers)
        response.raise_for_status()
        answer: dict[str, Any] = response.json()
        return answer


@dataclass
class Stack:
    workdir: Path
    up: UpProcess | None = None
    hub: HubServer | None = None
    agents: list[AgentProcess] = field(default_factory=list)
    runtimes: list[RuntimeProcess] = field(default_factory=list)
    direct: subprocess.Popen[bytes] | None = None

    def start_agent(self, config: Path) -> AgentProcess:
        # The tests' flows write a test-speed config (claims polled every 0.3 s,
        # telemetry every 0.5 s, DEBUG logs): at those rates the node's own traffic
        # took 8% of a core in the API, beside llama-server's two threads.
        settings = yaml.safe_load(config.read_text())
        settings.update(REAL_CADENCE_AGENT)
        config.write_text(yaml.safe_dump(settings))
        agent = AgentProcess(config, config.with_suffix(".log"))
        self.agents.append(agent)
        return agent

    def start_runtime(self, name: str = "rt", **settings: Any) -> RuntimeProcess:
        directory = self.workdir / name
        directory.mkdir(exist_ok=True)
        process = RuntimeProcess(directory, {**settings, **REAL_CADENCE_RUNTIME})
        self.runtimes.append(process)
        return process.start()

    def stop(self) -> None:
        """SIGTERM everything started, the direct server first; kill what stays."""
        if self.direct is not None and self.direct.poll() is None:
            self.direct.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.direct.wait(timeout=10)
            if self.direct.poll() is None:
                self.direct.kill()
        for rt in self.runtimes:
            with contextlib.suppress(Exception):
                rt.stop(timeout_s=30)
            rt.kill()
            for pidfile in rt.run_dir.glob("llama-server-*.json"):
                with contextlib.suppress(Exception):
                    os.killpg(int(json.loads(pidfile.read_text())["pid"]), signal.SIGKILL)
        for agent in self.agents:
            with contextlib.suppress(Exception):
                agent.stop()
            agent.kill()
        if self.up is not None:
            self.up.proc.send_signal(signal.SIGTERM)
            try:
                self.up.finish(90)
            except subprocess.TimeoutExpired:
                self.up.kill()
        if self.hub is not None:
            self.hub.stop()


def setup(
    stack: Stack,
    binary: Path,
    model: Path,
    api_env: dict[str, str],
    workload: Workload,
    baseline: str,
) -> tuple[StackApi, str, int, Direct]:
    """The stack up to a ready deployment: (api, client secret, API pid, the direct
    side: the deployment's own llama-server, or a second one started here)."""
    port = free_port()
    env = dict(api_env)
    stack.up = UpProcess(stack.workdir / "data", port, env)
    stack.up.wait_for(r"Operator key: ", timeout_s=180)
    key = (stack.workdir / "data" / OPERATOR_KEY_FILE).read_text().strip()
    api = StackApi(f"http://127.0.0.1:{port}", key)
    stack.hub = HubServer().start()
    running = cast(RunningApi, api)  # the flows use base_url, admin_headers, client()
    node_id, model_file, state = node_with_model(
        running, stack.start_agent, stack.hub, stack.workdir, model
    )
    node = ProbeNode(running, node_id, model_file, state, binary, stack.start_runtime)
    _, environment_id = node.runtime()
    profile = api.post(RUNTIME_PROFILES, {"name": "bench-gateway", "settings": workload.settings})
    endpoints = {"endpoints": workload.endpoints} if workload.endpoints else {}
    deployment = api.post(DEPLOYMENTS, {
        "node_id": node_id, "device_id": "cpu", "profile_id": profile["id"],
        "environment_id": environment_id, "model": MODEL, "roles": ["planner"],
        "artifact": {"repository": REPO, "commit": COMMIT, "path": GGUF},
        "max_concurrent": 64, **endpoints,
    })  # fmt: skip

    def ready() -> bool:
        state = api.get(f"{DEPLOYMENTS}/{deployment['id']}")["state"]
        if state == "failed":
            raise SystemExit(f"the deployment failed: {api.get(DEPLOYMENTS)}")
        return bool(state == "ready")

    wait_until(ready, 180, "the deployment to be ready")
    client = api.post(SERVICE_CLIENTS, {"name": "bench", "models": [MODEL]})
    api_pid = child_pid(stack.up, "modelforge api")
    if baseline == "deployment":
        return api, str(client["secret"]), api_pid, deployment_server(stack.runtimes[0])

    direct_port = free_port()
    argv = workload.direct_argv(binary, model_file, direct_port)
    print("direct:", " ".join(argv[1:]))
    log = (stack.workdir / "direct-llama.log").open("wb")
    stack.direct = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    direct_url = f"http://127.0.0.1:{direct_port}"

    def healthy() -> bool:
        assert stack.direct is not None
        if stack.direct.poll() is not None:
            raise SystemExit(f"the direct llama-server exited; see {log.name}")
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{direct_url}/health", timeout=1, trust_env=False).is_success
        return False

    wait_until(healthy, 60, "the direct llama-server")
    return api, str(client["secret"]), api_pid, Direct(direct_url)


def deployment_server(runtime: RuntimeProcess) -> Direct:
    """The deployment's own llama-server, from its worker's pidfile and key file (this
    bench runs as the worker's user)."""
    record = json.loads((runtime.run_dir / "llama-server-cpu.json").read_text())
    key = (runtime.run_dir / "llama-server-cpu.key").read_text().strip()
    direct = Direct(f"http://127.0.0.1:{record['port']}", key)
    print(f"direct: the deployment's own llama-server, {direct.url}, the worker's key")
    return direct


def cpu_s(proc: psutil.Process) -> float:
    """CPU seconds of the API process and any children it has."""
    total = 0.0
    for each in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            times = each.cpu_times()
            total += times.user + times.system
    return total


async def measure(
    workload: Workload,
    gateway: str,
    secret: str,
    direct: Direct,
    api_pid: int,
    requests: int,
    levels: list[int],
    loads: list[float],
) -> list[tuple[str, Side, Side]]:
    """The closed-loop levels, then the open-loop loads (fractions of the most invokes a
    second the direct side served in a closed round of this run)."""
    api_proc = psutil.Process(api_pid)
    bearer = {"Authorization": f"Bearer {secret}"}
    targets: dict[str, Target] = {
        "direct": direct.target(workload.direct_path, workload.direct_body),
        "gateway": (f"{gateway}{workload.gateway_path}", bearer, workload.gateway_body),
    }
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    rows = []
    async with httpx.AsyncClient(timeout=120, limits=limits, trust_env=False) as client:
        for name, target in targets.items():  # warm-up, and a check of both paths
            warm, _ = await run_round(client, target, 4, 4)
            if any(r.error for r in warm):
                raise SystemExit(f"{name} warm-up failed: {[r.error for r in warm]}")
            if workload.name == "tools" and any(r.first != "tool_calls" for r in warm):
                raise SystemExit(f"{name}: an answer did not open with a tool call")

        async def rounds(label: str, concurrency: int = 0, rate: float = 0.0) -> None:
            sides = {"direct": Side(), "gateway": Side()}
            for index in range(4):  # direct, gateway, gateway, direct
                name = ("direct", "gateway")[index in (1, 2)]
                before, stalled = cpu_s(api_proc), await stalls(client, gateway)
                if rate:  # rounds 0 and 1 (direct, gateway) share a schedule, as 2 and 3 do
                    offsets = arrivals(rate, requests, seed=index // 2)
                    results, wall = await run_open(client, targets[name], offsets)
                else:
                    results, wall = await run_round(client, targets[name], requests, concurrency)
                side = sides[name]
                side.results += results
                side.round_p50s.append(pct(Side(results).ttfts_ms(), 50))
                side.wall += wall
                side.cpu += cpu_s(api_proc) - before
                late, gcs = await stalls(client, gateway)
                side.late_wakes += late - stalled[0]
                side.long_gcs += gcs - stalled[1]
            rows.append((label, sides["direct"], sides["gateway"]))

        for concurrency in levels:
            await rounds(str(concurrency), concurrency=concurrency)
        capacity = max((d.invokes_per_s() for _, d, _ in rows), default=0.0)
        for load in loads:
            rate = load * capacity
            print(f"open loop {load:g}x: Poisson arrivals at {rate:.2f}/s ({load:g} of the direct "
                  f"side's {capacity:.2f} invokes/s), the same times both sides")  # fmt: skip
            await rounds(f"{load:g}x", rate=rate)
    return rows


BASELINES = {
    "deployment": "the deployment's own llama-server, called directly with the worker's key",
    "second": "a second plain llama-server started by this bench, same model and the "
    "worker's flags (above)",
}


def report(workload: Workload, rows: list[tuple[str, Side, Side]], baseline: str) -> None:
    print(f"workload {workload.name}; baseline: {BASELINES[baseline]}")
    # Issue 34's workloads are judged on the added TTFT only (their tokens/s is the grammar's).
    chat = workload.name == "chat"
    ratio_goal = f"; tokens/s ratio >= {GOAL_RATIO}" if chat else ""
    print(f"goals: added TTFT p50 < {GOAL_P50_MS:g} ms, p99 < {GOAL_P99_MS:g} ms{ratio_goal}")
    head = (f"{'conc':>4} {'TTFT p50 d/g ms':>17} {'+p50':>7} {'TTFT p99 d/g ms':>17} "
            f"{'+p99':>7} {'tok/s g/d':>9} {'inv/s d/g':>11} {'API cpu ms/inv':>14} "
            f"{'bg cpu %':>8} {'tok/req d/g':>11} {'err d/g':>7} "
            f"{'deliver p50/p99':>15} {'in flight d/g':>13}")  # fmt: skip
    print(head)
    for label, d, g in rows:
        dt, gt = d.ttfts_ms(), g.ttfts_ms()
        add50, add99 = pct(gt, 50) - pct(dt, 50), pct(gt, 99) - pct(dt, 99)
        ratio = g.tokens_per_s() / d.tokens_per_s()
        ok = add50 < GOAL_P50_MS and add99 < GOAL_P99_MS and (ratio >= GOAL_RATIO or not chat)
        served = max(1, len(g.results) - g.errors())
        print(
            f"{label:>4} {pct(dt, 50):>8.1f}/{pct(gt, 50):<8.1f} {add50:>+7.1f} "
            f"{pct(dt, 99):>8.1f}/{pct(gt, 99):<8.1f} {add99:>+7.1f} {ratio:>9.3f} "
            f"{d.invokes_per_s():>5.2f}/{g.invokes_per_s():<5.2f} "
            f"{g.cpu / served * 1000:>14.2f} {100 * d.cpu / d.wall:>8.1f} "
            f"{d.tokens_per_request():>5.1f}/{g.tokens_per_request():<5.1f} "
            f"{d.errors():>3}/{g.errors():<3} "
            f"{pct(g.overheads_ms(), 50):>7.1f}/{pct(g.overheads_ms(), 99):<7.1f} "
            f"{d.in_flight():>6.2f}/{g.in_flight():<6.2f} {'ok' if ok else 'MISS'}"
        )
        noise = max(d.round_p50s) - min(d.round_p50s)
        if noise > GOAL_P50_MS:
            print(f"     the two direct rounds' TTFT p50 differ by {noise:.1f} ms: more than the "
                  "goal, so the added ms are within the box's noise")  # fmt: skip
        if g.late_wakes or g.long_gcs:
            print(f"     the API's event loop in the gateway rounds: woke > {LATE_S} s late "
                  f"{g.late_wakes:g}x, collections > {LONG_GC_S} s {g.long_gcs:g}x")  # fmt: skip
        if workload.name == "tools":
            print(f"     first token a tool call: direct {d.firsts('tool_calls')}/{len(d.results)}"
                  f", gateway {g.firsts('tool_calls')}/{len(g.results)}")  # fmt: skip


async def grammar_cost(widest: Workload, gateway: str, secret: str, direct: Direct) -> None:
    """TTFT of the widest schema the bounds allow, a few requests one at a time each way
    (its grammar is built per request on both sides: llama-server's cost, not ours)."""
    size = len(json.dumps(widest.gateway_body["response_format"]["json_schema"]["schema"]))
    bearer = {"Authorization": f"Bearer {secret}"}
    targets = {
        "direct": direct.target(widest.direct_path, widest.direct_body),
        "gateway": (f"{gateway}{widest.gateway_path}", bearer, widest.gateway_body),
    }
    medians = {}
    async with httpx.AsyncClient(timeout=300, trust_env=False) as client:
        for name, target in targets.items():
            results, _ = await run_round(client, target, GRAMMAR_REQUESTS, 1)
            if any(r.error or r.ttft is None for r in results):
                raise SystemExit(f"widest schema, {name}: {[r.error for r in results]}")
            medians[name] = statistics.median(r.ttft for r in results if r.ttft) * 1000
    print(f"widest schema (128 required strings, maxLength 1000; {size} chars), "
          f"TTFT median of {GRAMMAR_REQUESTS}, concurrency 1: direct {medians['direct']:.0f} ms, "
          f"gateway {medians['gateway']:.0f} ms")  # fmt: skip


def pin_model_servers(stack: Stack, cores: frozenset[int]) -> None:
    """The deployment's llama-server (its pid from the runtime worker's pidfile) and the
    direct one onto the model's cores."""
    served = [pid for rt in stack.runtimes if (pid := rt.server_pid()) is not None]
    if not served:
        raise SystemExit("the deployment's llama-server has no pidfile")
    pids = [*served, *([stack.direct.pid] if stack.direct is not None else [])]
    for pid in pids:
        pinning.pin_process(pid, cores)


def load() -> str:
    return "{:.2f} {:.2f} {:.2f} (1/5/15 min)".format(*os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=40, help="per round")
    parser.add_argument("--concurrency", default="1,4,16", help="closed-loop levels")
    parser.add_argument(
        "--open-loads", default="",
        help="open-loop rows after the closed ones, e.g. 0.5,0.8: Poisson arrivals at that "
        "fraction of the direct side's best closed-loop invokes/s (ops/bench/gateway_rounds.py)",
    )  # fmt: skip
    parser.add_argument("--workload", choices=gateway_workloads.NAMES, default="chat")
    parser.add_argument(
        "--duration", type=float, default=5.0, help="embeddings: seconds per wrk round"
    )
    parser.add_argument(
        "--token-gap-s", type=float, default=None,
        help="the gateway's token gap timeout (default its own, 30 s: a box loaded past "
        "its cores can stall a stream longer; the bench measures the first token)",
    )  # fmt: skip
    parser.add_argument(
        "--threads", type=int, default=None,
        help="llama-server --threads, both sides (default: the cores it is pinned to, else 2; "
        "1 on a box whose 2 cores are shared: two threads wait on each other's barrier there)",
    )  # fmt: skip
    parser.add_argument(
        "--pin", action=argparse.BooleanOptionalAction, default=True,
        help="llama-server on the last core alone, all else on the others (ops/bench/pinning.py)",
    )  # fmt: skip
    parser.add_argument(
        "--baseline", choices=("deployment", "second"), default="deployment",
        help="the direct side: the deployment's own llama-server (default: the same process, "
        "so the same prompt cache and parser both ways) or a second one with its flags",
    )  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs)")
    parser.add_argument(
        "--api-processes", type=int, default=1, help="`modelforge api --processes` (default 1)"
    )
    args = parser.parse_args()
    levels = [int(level) for level in args.concurrency.split(",")]
    loads = [float(load) for load in args.open_loads.split(",") if load]
    cores = pinning.split() if args.pin else None
    threads = args.threads or (len(cores.model) if cores else 2)
    workload = gateway_workloads.workload(args.workload, CHAT_BODY, threads)
    if not workload.streamed and not wrk_load.available():
        raise SystemExit("the embeddings workload needs wrk (apt-get install wrk)")
    binary = runtime_bench._built()
    model = runtime_bench._built("--model")
    workdir = Path(tempfile.mkdtemp(prefix="mf-bench-gateway-"))
    stack = Stack(workdir)
    keep = args.keep
    try:
        api_env = {"MODELFORGE_API_PROCESSES": str(args.api_processes)}
        if args.token_gap_s is not None:
            api_env["MODELFORGE_GATEWAY_TOKEN_GAP_TIMEOUT_S"] = f"{args.token_gap_s:g}"
        api, secret, api_pid, direct = setup(stack, binary, model, api_env, workload, args.baseline)
        if cores is not None:
            pin_model_servers(stack, cores.model)
            print(cores.describe())
        print(f"load average at start: {load()}")
        if workload.streamed:
            rows = asyncio.run(
                measure(
                    workload, api.base_url, secret, direct, api_pid, args.requests, levels, loads
                )
            )
            report(workload, rows, args.baseline)
            if workload.name == "json_schema":
                widest = gateway_workloads.widest_schema(threads)
                asyncio.run(grammar_cost(widest, api.base_url, secret, direct))
        else:
            api_proc = psutil.Process(api_pid)
            figures = gateway_embeddings.measure(
                workload, (api.base_url, secret, direct), lambda: cpu_s(api_proc),
                levels, args.duration, workdir,
            )  # fmt: skip
            gateway_embeddings.report(figures, BASELINES[args.baseline])
        print(f"load average at the end: {load()}")
    except BaseException:
        keep = True  # the logs (up's output, agent.log, rt/runtime.log) for the failure
        if stack.up is not None:
            print(stack.up.output[-3000:], file=sys.stderr)
        raise
    finally:
        stack.stop()
        if keep:
            print(f"logs in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
