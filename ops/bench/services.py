"""Model services at fleet scale (issue 32), each figure against a baseline or a bound
measured or stated in the same run.

    python ops/bench/services.py [--relay-nodes 8 --levels 8,32,64,128,256]

1. **Placement** over 10,000 nodes (decision p99, a service of 100 replicas placed):
   ops/bench/service_placement.py: placement_figures on a fresh embedded PostgreSQL.
2. **Zero failures**: `modelforge up` (embedded PostgreSQL and NATS, the API and the
   workers) with short liveness thresholds and heal grace, a Hub-layout source with the
   model file, simulated nodes (`modelforge simulate --runtime`, one process per node
   so one can be killed); a service of 2 replicas; a steady load of streamed
   completions from clients that retry as the `openai` client does (2 retries on
   connection errors, 408/409/429/5xx) during a rollout to another profile and during
   a scale-down 2 -> 1: failed and cut counts.
3. **Heal**: back at 2 replicas, one replica's node killed (SIGKILL: its agent and its
   runtime worker); the time until a replacement replica on another node is ready and
   a request is served by it, printed beside its bound (offline threshold + heal grace
   + reconciler period + the simulated acquire and load times).
4. **Relay**: operator deployments on every device of `--relay-nodes` simulated nodes,
   streamed completions through the gateway at increasing concurrency from generator
   processes; relayed tokens/s against the simulated rate (concurrency x tokens/s per
   stream) and the added inter-token p99 against the simulated interval (1 / rate);
   the knee is the level that relays the most tokens/s with an added p99 below 50 ms.
   CPU of the API, the workers, PostgreSQL, NATS, the simulator and the generators per
   level, and the machine's load average (other work on a shared box shows there).

A figure that could not be produced prints `not measured: <why>`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import hashlib
import importlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))
import heartbeats as hb  # noqa: E402  (sibling bench module: the embedded database)
import services_load as load  # noqa: E402

from agent.sim_runtime import SIM_BINARY_SHA256  # noqa: E402
from schemas.protocol import (  # noqa: E402
    ARTIFACT_JOBS,
    DEPLOYMENTS,
    GATEWAY_CHAT_COMPLETIONS,
    NODES,
    ROUTE_NODE_HEADER,
    RUNTIME_ENVIRONMENTS,
    RUNTIME_PROFILES,
    SERVICE_CLIENTS,
    SERVICES,
)
from schemas.stack import OPERATOR_KEY_FILE  # noqa: E402
from tests.hub_server import HubServer  # noqa: E402
from tests.up_process import UpProcess, child_pid  # noqa: E402

ROOT = "/srv/simulated-models"
REPOSITORY = "bench/service-model"
COMMIT = "b" * 40
FILE = "model.gguf"
MODEL_BYTES = 64 * 1024
HEARTBEAT_S, STALE_S, OFFLINE_S = 2.0, 6.0, 10.0
RATE = 50.0  # simulated tokens/s per stream
LOAD_S = 2.0
# The service reconciler's grace before a lost replica is replaced, and its period
# (workers/settings.py: service_heal_grace_s, service_sweep_period_s; 30 s and 2 s by
# default): the bench sets a short grace so that the heal is measured in seconds.
HEAL_GRACE_S, SWEEP_S = 5.0, 2.0
# The knee: the most tokens/s relayed at a level whose added inter-token p99 stays below.
KNEE_ADDED_MS = 50.0


def model_bytes() -> bytes:
    block = hashlib.sha256(b"bench").digest()
    return (block * (MODEL_BYTES // len(block) + 1))[:MODEL_BYTES]


class Admin:
    def __init__(self, base_url: str, key: str) -> None:
        self.base_url = base_url
        self.http = httpx.AsyncClient(base_url=base_url, timeout=30, trust_env=False)
        self.headers = {"X-ModelForge-Admin-Token": key}

    async def call(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        response = await self.http.request(
            method, path, json=body, params=params or None, headers=self.headers
        )
        if response.status_code >= 300:
            raise RuntimeError(f"{method} {path}: {response.status_code} {response.text[:500]}")
        return response.json()


async def until(check: Callable[[], Awaitable[Any]], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = await check()
        if value:
            return value
        await asyncio.sleep(0.1)
    raise TimeoutError(f"{what}: not within {timeout_s:g} s")


# ------------------------------------------------------------------ simulated nodes


class Sims:
    """`modelforge simulate --runtime` processes; each knows its run id (its nodes' label)."""

    def __init__(self, api_url: str, key: str, workdir: Path) -> None:
        self.api_url, self.key, self.workdir = api_url, key, workdir
        self.procs: dict[str, subprocess.Popen[str]] = {}

    def start(self, nodes: int, label: str, *extra: str) -> str:
        argv = [
            sys.executable, "-m", "cli.main", "simulate", "--api-url", self.api_url,
            "--operator-key", self.key, "--nodes", str(nodes), "--runtime",
            "--devices-per-node", "2", "--device-memory-gib", "80",
            "--tokens-per-s", str(RATE), "--load-s", str(LOAD_S), "--acquire-s", "0.5",
            "--heartbeat-interval", str(HEARTBEAT_S), "--telemetry-interval", "30",
            "--runtime-report-interval", "5", "--job-poll-interval", "5",
            "--label", label, *extra,
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("MODELFORGE_")}
        log = (self.workdir / f"sim-{len(self.procs)}.log").open("w")
        proc = subprocess.Popen(
            argv, cwd=hb.ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True
        )
        assert proc.stdout is not None
        first = proc.stdout.readline()
        run_id = first.split("(run ")[1].split(")")[0]
        self.procs[run_id] = proc
        return run_id

    def kill(self, run_id: str) -> None:
        self.procs[run_id].send_signal(signal.SIGKILL)
        self.procs[run_id].wait()

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


async def nodes_of(admin: Admin, run_id: str, count: int) -> list[dict[str, Any]]:
    """The run's nodes once all are online with their runtime reported."""

    async def ready() -> list[dict[str, Any]] | None:
        items: list[dict[str, Any]] = (
            await admin.call("GET", NODES, label=f"sim-run={run_id}", limit=1000)
        )["items"]
        if len(items) < count or any(n.get("liveness", "online") != "online" for n in items):
            return None
        for node in items:
            if not (await admin.call("GET", f"{NODES}/{node['id']}/runtime"))["reported"]:
                return None
        return items

    found: list[dict[str, Any]] = await until(ready, 120, f"{count} simulated nodes")
    return found


async def environment(admin: Admin) -> str:
    async def found() -> str | None:
        items = (await admin.call("GET", RUNTIME_ENVIRONMENTS))["items"]
        return next((e["id"] for e in items if e["binary_sha256"] == SIM_BINARY_SHA256), None)

    value: str = await until(found, 60, "the simulated environment")
    return value


# -------------------------------------------------------------------------- placement


def placement(workdir: Path) -> list[str]:
    try:
        module = importlib.import_module("service_placement")
    except ImportError as exc:
        return [f"placement: not measured: ops/bench/service_placement.py not available ({exc})"]
    with hb.database(workdir / "placement", True) as (database_url, _):
        figures: dict[str, Any] = module.placement_figures(
            database_url, nodes=10_000, decisions=200
        )
    return [f"placement: {key} = {value}" for key, value in figures.items()]


# ------------------------------------------------------------------ heal, rollout, scale


async def service_view(admin: Admin, service_id: str) -> dict[str, Any]:
    view: dict[str, Any] = await admin.call("GET", f"{SERVICES}/{service_id}")
    return view


async def services_figures(
    admin: Admin, sims: Sims, env_id: str, profiles: list[str], secret: str
) -> list[str]:
    lines: list[str] = []
    probe = await admin.http.get(SERVICES, headers=admin.headers)
    if probe.status_code == 404:
        why = "not measured: the services route (POST /api/v1/admin/services) is not in this API"
        return [f"heal: {why}", f"failures during rollout and scale-down: {why}"]
    run_ids = [sims.start(1, "bench=heal") for _ in range(4)]
    node_run: dict[str, str] = {}
    for run_id in run_ids:
        [node] = await nodes_of(admin, run_id, 1)
        node_run[node["id"]] = run_id
    body = {
        "name": "healed", "roles": ["planner"],
        "artifact": {"repository": REPOSITORY, "revision": "main", "path": FILE},
        "profile_id": profiles[0], "environment_id": env_id, "replicas": 2,
        "placement": {"selector": {"bench": "heal"}, "device_kind": "cuda"},
        "strategy": {"drain_deadline_s": 30},
    }  # fmt: skip
    started = time.monotonic()
    service = await admin.call("POST", SERVICES, body)
    sid = service["id"]

    async def ready(count: int) -> dict[str, Any] | None:
        """The view once `count` replicas are ready and none is on its way in or out
        (a replica left unavailable on a dead node is not waited for)."""
        view = await service_view(admin, sid)
        moving = [r for r in view["items"] if r["phase"] in ("acquiring", "loading", "draining")]
        return view if view["ready_replicas"] == count and not moving else None

    view = await until(lambda: ready(2), 120, "2 replicas ready")
    lines.append(
        f"service of 2 replicas on 4 simulated nodes: ready in {time.monotonic() - started:.1f} s"
        f" (acquire 0.5 s + load {LOAD_S:g} s simulated)"
    )
    gateway = f"{admin.base_url}{GATEWAY_CHAT_COMPLETIONS}"
    steady = load.SteadyLoad(gateway, secret, "healed")
    steady.start()
    await asyncio.sleep(3)
    lines.append(f"steady load before the changes: {steady.phase().line()}")

    def progress(view: dict[str, Any]) -> str:
        phases = ", ".join(f"g{r['generation']} {r['phase']}" for r in view["items"])
        return f"rollout {view['rollout']}, replicas: {phases}"

    async def under_load(
        label: str, check: Callable[[], Awaitable[Any]], what: str, says: Callable[[], str]
    ) -> None:
        """Wait (120 s at most) for `check` under the steady load; one line: `says()` and
        the requests that failed meanwhile, or why it was not measured."""
        try:
            await until(check, 120, what)
            counts = steady.phase()
            lines.append(
                f"{says()} under steady load: {counts.failed + counts.cut} failed ({counts.line()})"
            )
        except TimeoutError as exc:
            view = await service_view(admin, sid)
            lines.append(
                f"{label}: not measured: {exc}: {progress(view)} ({steady.phase().line()})"
            )

    # A rollout to another profile under the steady load.
    rolled = time.monotonic()
    await admin.call("POST", f"{SERVICES}/{sid}/rollout", {"profile_id": profiles[1]})

    async def rolled_out() -> bool:
        view = await service_view(admin, sid)
        r = view["rollout"]
        return bool(r["state"] == "complete" and r["outdated"] == 0 and await ready(2))

    await under_load(
        "rollout",
        rolled_out,
        "the rollout complete",
        lambda: f"rollout of 2 replicas to a new profile in {time.monotonic() - rolled:.1f} s",
    )

    # A scale-down 2 -> 1 under the steady load; then back to 2 for the heal.
    await admin.call("POST", f"{SERVICES}/{sid}/scale", {"replicas": 1})
    await under_load(
        "scale-down", lambda: ready(1), "scaled down to 1", lambda: "scale-down 2 -> 1"
    )
    await admin.call("POST", f"{SERVICES}/{sid}/scale", {"replicas": 2})
    view = await until(lambda: ready(2), 120, "2 replicas ready again")
    steady.phase()

    # Heal: kill one replica's node (its agent and runtime worker, one process).
    victim = next(r for r in view["items"] if r["phase"] == "ready")
    old_nodes = {r["node_id"] for r in view["items"]}
    killed_at = time.monotonic()
    sims.kill(node_run[victim["node_id"]])

    async def replaced() -> bool:
        view = await service_view(admin, sid)
        fresh = [r for r in view["items"] if r["node_id"] not in old_nodes]
        return any(r["phase"] == "ready" for r in fresh)

    try:
        await until(replaced, 180, "a replacement replica ready")
        ready_after = time.monotonic() - killed_at

        async def served_by_new() -> bool:
            async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
                response = await client.post(
                    gateway,
                    json={"model": "healed", "max_tokens": 2,
                          "messages": [{"role": "user", "content": "x"}]},
                    headers={"Authorization": f"Bearer {secret}"},
                )  # fmt: skip
            return response.headers.get(ROUTE_NODE_HEADER) not in (None, *old_nodes)

        await until(served_by_new, 60, "a request served by the replacement")
        serving_after = time.monotonic() - killed_at
        bound = OFFLINE_S + HEAL_GRACE_S + SWEEP_S + 0.5 + LOAD_S
        lines.append(
            f"heal: node killed -> replacement ready {ready_after:.1f} s, serving"
            f" {serving_after:.1f} s; bound: offline threshold {OFFLINE_S:g} s + heal grace"
            f" {HEAL_GRACE_S:g} s + reconciler period {SWEEP_S:g} s + acquire 0.5 s + load"
            f" {LOAD_S:g} s = {bound:g} s"
        )
    except TimeoutError as exc:
        lines.append(f"heal: not measured: {exc}: {progress(await service_view(admin, sid))}")
    counts = steady.phase()
    lines.append(
        f"steady load while the node was lost: {counts.line()} (streams on the killed node"
        " are cut: no retry can save a stream that had begun)"
    )
    await steady.close()
    return lines


# ------------------------------------------------------------------------------ relay


def cpu_s(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            for each in [proc, *proc.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    t = each.cpu_times()
                    total += t.user + t.system
    return total


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


async def relay_figures(
    admin: Admin,
    sims: Sims,
    env_id: str,
    profile: str,
    nodes: int,
    levels: list[int],
    window_s: float,
    generators: int,
    roles: dict[str, list[int]],
) -> list[str]:
    run_id = sims.start(nodes, "bench=relay", "--concurrency", "16")
    roles = {**roles, "sim": [sims.procs[run_id].pid]}
    found = await nodes_of(admin, run_id, nodes)
    manifest = {"repository": REPOSITORY, "commit": COMMIT, "files": [{
        "path": FILE, "size": MODEL_BYTES,
        "digest": {"algorithm": "sha256", "value": hashlib.sha256(model_bytes()).hexdigest()},
    }]}  # fmt: skip

    async def acquisition(node_id: str) -> str | None:
        """An artifact job on the node, once its first inventory offered the root."""
        body = {"node_id": node_id, "target_root": ROOT, "manifest": manifest}
        response = await admin.http.post(ARTIFACT_JOBS, json=body, headers=admin.headers)
        if response.status_code == 422 and "target_root_not_allowed" in response.text:
            return None
        if response.status_code != 201:
            raise RuntimeError(f"POST {ARTIFACT_JOBS}: {response.status_code} {response.text}")
        job_id: str = response.json()["id"]
        return job_id

    jobs = [
        await until(functools.partial(acquisition, n["id"]), 60, "the root offered") for n in found
    ]

    async def acquired() -> bool:
        states = [(await admin.call("GET", f"{ARTIFACT_JOBS}/{j}"))["state"] for j in jobs]
        return all(s == "succeeded" for s in states)

    await until(acquired, 120, "the relay nodes' acquisitions")
    deployments = []
    for node in found:
        for device in ("gpu:0", "gpu:1"):
            created = await admin.call("POST", DEPLOYMENTS, {
                "node_id": node["id"], "device_id": device, "profile_id": profile,
                "environment_id": env_id, "model": "relay", "roles": ["planner"],
                "artifact": {"repository": REPOSITORY, "commit": COMMIT, "path": FILE},
                "max_concurrent": 64,
            })  # fmt: skip
            deployments.append(created["id"])

    async def all_ready() -> bool:
        states = [(await admin.call("GET", f"{DEPLOYMENTS}/{d}"))["state"] for d in deployments]
        return all(s == "ready" for s in states)

    await until(all_ready, 180, "the relay deployments ready")
    secret = (
        await admin.call("POST", SERVICE_CLIENTS, {"name": "relay-bench", "models": ["relay"]})
    )["secret"]
    url = f"{admin.base_url}{GATEWAY_CHAT_COMPLETIONS}"
    max_tokens = int(RATE * 2)  # 2 s per stream at the simulated rate
    interval_ms = 1000 / RATE
    lines = [
        f"relay: {len(deployments)} replicas (deployments) on {nodes} simulated nodes, "
        f"{RATE:g} tokens/s per stream, {max_tokens} tokens per stream; baseline: the "
        f"simulated rate (concurrency x {RATE:g} tokens/s) and interval ({interval_ms:.0f} ms)",
        f"{'streams':>7} {'tok/s':>8} {'offered':>8} {'ratio':>6} {'gap p50':>8} "
        f"{'gap p99':>8} {'+p99 ms':>8} {'ttft p50':>8} {'failed':>6}  cpu s/s: "
        + " ".join(f"{role}" for role in [*roles, "generators"])
        + "  load avg (the machine's, other work included)",
    ]
    knee = None
    with ProcessPoolExecutor(generators) as pool:
        load.relay_in_processes(pool, generators, url, secret, "relay", 2, 1.0, 4)  # warm-up
        # The pool's processes, to count their CPU (the pool names them nowhere else).
        workers = [p.pid for p in pool._processes.values() if p.pid is not None]
        for level in levels:
            before = {role: cpu_s(pids) for role, pids in roles.items()}
            gen_before = cpu_s(workers)
            result = await asyncio.to_thread(
                load.relay_in_processes, pool, generators, url, secret, "relay", level,
                window_s, max_tokens,
            )  # fmt: skip
            wall = result["wall"]
            cpu = {role: (cpu_s(pids) - before[role]) / wall for role, pids in roles.items()}
            cpu["generators"] = (cpu_s(workers) - gen_before) / wall
            gaps_ms = [g * 1000 for g in result["gaps"]]
            ttfts_ms = [t * 1000 for t in result["ttfts"]]
            rate = result["tokens"] / wall
            offered = level * RATE
            ratio = rate / offered
            p99 = pct(gaps_ms, 99)
            added = p99 - interval_ms
            fine = added < KNEE_ADDED_MS and result["failed"] == 0
            if fine and (knee is None or rate > knee[1]):
                knee = (level, rate, added, ratio)
            lines.append(
                f"{level:>7} {rate:>8.0f} {offered:>8.0f} {ratio:>6.2f} {pct(gaps_ms, 50):>8.1f} "
                f"{p99:>8.1f} {added:>+8.1f} {pct(ttfts_ms, 50):>8.1f} {result['failed']:>6}  "
                + " ".join(f"{value:.2f}" for value in cpu.values())
                + f"  {os.getloadavg()[0]:.1f}"
            )
    if knee is None:
        lines.append(f"relay knee: below the first level (added p99 >= {KNEE_ADDED_MS:g} ms)")
    else:
        lines.append(
            f"relay knee: {knee[0]} concurrent streams, {knee[1]:.0f} tokens/s relayed"
            f" ({knee[3]:.2f} of the simulated rate) with +{knee[2]:.1f} ms inter-token p99"
            f" (the most tokens/s at a level with < {KNEE_ADDED_MS:g} ms added p99)"
        )
    return lines


# ------------------------------------------------------------------------------- main


def child(up: UpProcess, name: str) -> int | None:
    """The pid of up's child `name`, or None where it is not up's own child."""
    try:
        return child_pid(up, name)
    except AssertionError:
        return None


@contextlib.contextmanager
def started_up(workdir: Path, hub_url: str) -> Iterator[tuple[UpProcess, str, str]]:
    port = hb.free_port()
    env = {
        "MODELFORGE_HEARTBEAT_INTERVAL_S": str(HEARTBEAT_S),
        "MODELFORGE_STALE_AFTER_S": str(STALE_S),
        "MODELFORGE_OFFLINE_AFTER_S": str(OFFLINE_S),
        "MODELFORGE_ARTIFACT_SOURCE_URL": hub_url,
        "MODELFORGE_SERVICE_HEAL_GRACE_S": str(HEAL_GRACE_S),
        "MODELFORGE_SERVICE_SWEEP_PERIOD_S": str(SWEEP_S),
        "MODELFORGE_LOG_LEVEL": "WARNING",
    }
    up = UpProcess(workdir / "data", port, env)
    try:
        up.wait_for(r"Operator key: ", timeout_s=180)
        key = (workdir / "data" / OPERATOR_KEY_FILE).read_text().strip()
        yield up, f"http://127.0.0.1:{port}", key
    finally:
        up.proc.send_signal(signal.SIGTERM)
        try:
            up.finish(90)
        except subprocess.TimeoutExpired:
            up.kill()


async def run(args: argparse.Namespace, workdir: Path) -> list[str]:
    lines: list[str] = []
    hub = HubServer().start()
    hub.state.add(REPOSITORY, "main", COMMIT, {FILE: model_bytes()})
    try:
        with started_up(workdir, hub.url) as (up, api_url, key):
            admin = Admin(api_url, key)
            sims = Sims(api_url, key, workdir)
            try:
                roles = {
                    role: [pid]
                    for role, name in (("api", "modelforge api"), ("worker", "modelforge worker"),
                                       ("postgres", "PostgreSQL"), ("nats", "nats-server"))
                    if (pid := child(up, name)) is not None
                }  # fmt: skip
                probe_run = sims.start(1, "bench=probe")
                await nodes_of(admin, probe_run, 1)
                env_id = await environment(admin)
                profiles = [
                    (await admin.call("POST", RUNTIME_PROFILES,
                                      {"name": f"bench-{i}", "settings": {"ctx_size": 2048}}))["id"]
                    for i in range(2)
                ]  # fmt: skip
                secret = (
                    await admin.call(
                        "POST", SERVICE_CLIENTS, {"name": "bench", "models": ["healed"]}
                    )
                )["secret"]
                parts = (
                    []
                    if args.skip_services
                    else [services_figures(admin, sims, env_id, profiles, secret)]
                )
                for part in (
                    *parts,
                    relay_figures(admin, sims, env_id, profiles[0], args.relay_nodes,
                                  args.levels, args.window, args.generators, roles),
                ):  # fmt: skip
                    try:
                        found = await part
                    except (RuntimeError, TimeoutError) as exc:
                        found = [f"not measured: {exc}"]
                    for line in found:
                        print(line, flush=True)
                    lines += found
            finally:
                sims.stop()
                await admin.http.aclose()
    finally:
        hub.stop()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--relay-nodes", type=int, default=8)
    parser.add_argument(
        "--levels", type=lambda s: [int(v) for v in s.split(",")], default=[8, 32, 64, 128, 256]
    )
    parser.add_argument("--window", type=float, default=8.0, help="seconds per relay level")
    parser.add_argument("--generators", type=int, default=2, help="load generator processes")
    parser.add_argument("--skip-placement", action="store_true")
    parser.add_argument("--skip-services", action="store_true", help="heal, rollout, scale")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs)")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="mf-bench-services-"))
    keep = args.keep
    try:
        if not args.skip_placement:
            # Before the stack starts: its own database, and the whole machine.
            for line in placement(workdir):
                print(line, flush=True)
        asyncio.run(run(args, workdir))
    except BaseException:
        keep = True
        raise
    finally:
        if keep:
            print(f"logs in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
