"""Fleet simulator: N simulated agents in one process, through the agent's real protocol
client and publishing loops, for load tests and demos.

    modelforge simulate --nodes 500 --api-url http://127.0.0.1:8080 --duration 60

For each node it creates an enrollment token through the admin API (labels
simulated=true and sim-run=<run id>), enrolls, and then runs heartbeat, inventory and
telemetry with simulated GPUs and host. Requests in flight are bounded (--concurrency)
over one shared connection pool. --duration counts from the moment every node is
enrolled; 0 runs until Ctrl-C. Every failed request is counted as an error (retried
ones too); the exit status is 0 only when there was none.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import secrets
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agent import AGENT_VERSION, CAPABILITIES
from agent.client import OperatorClient, ProtocolClient, TlsOptions, make_http_client
from agent.collectors.host import HostTelemetry
from agent.collectors.simulated import SimulatedCollector
from agent.diagnostics import configure_logging, failure_line
from agent.errors import RequestFailed
from agent.publisher import Publisher, Stats, Timing
from agent.retry import Stopped, interruptible_sleep, retry_transient
from agent.sim_runtime import GIB, RuntimeCounters, RuntimeOptions, SimRuntime
from agent.state import Sequences
from schemas.admin import CreateEnrollmentToken
from schemas.agent import PROTOCOL_VERSION, EnrollRequest, HostFacts, StorageTelemetry
from schemas.stack import StackFileError, operator_key_from, read_stack_info

logger = logging.getLogger("modelforge.agent.simulator")

RAM = 512 * 2**30
# Connections per HTTP pool (see Fleet.run).
POOL_SIZE = 8
DISK = 4 * 2**40


@dataclass
class SimOptions:
    nodes: int
    api_url: str
    operator_key: str
    duration_s: float = 0.0
    heartbeat_interval_s: float = 5.0
    telemetry_interval_s: float = 10.0
    inventory_interval_s: float = 60.0
    gpus: int = 2
    concurrency: int = 32
    # Latencies count only after this long of publishing: the first round (every node
    # coming online, its first inventory) is a burst, not the steady state.
    latency_warmup_s: float = 0.0
    enroll_concurrency: int = 8
    request_timeout_s: float = 30.0
    tls: TlsOptions = field(default_factory=TlsOptions)
    run_id: str = field(default_factory=lambda: secrets.token_hex(3))
    # Simulated runtime workers beside the agents (agent/sim_runtime.py), or none.
    runtime: RuntimeOptions | None = None
    # Labels every simulated node gets beside simulated=true and sim-run.
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class SimReport:
    nodes: int
    enrolled: int
    enroll_s: float
    steady_s: float
    sent: Counter[str]
    failures: Counter[str]
    latencies: dict[str, list[float]] = field(default_factory=dict)
    runtime: RuntimeCounters | None = None

    @property
    def errors(self) -> int:
        return sum(self.failures.values())

    def percentile(self, operation: str, q: float) -> float | None:
        values = sorted(self.latencies.get(operation, []))
        if not values:
            return None
        return values[min(len(values) - 1, int(q / 100 * len(values)))]

    def as_json(self) -> dict[str, Any]:
        """What ops/bench/fleet.py reads (--report-json)."""
        return {
            "nodes": self.nodes,
            "enrolled": self.enrolled,
            "enroll_s": self.enroll_s,
            "steady_s": self.steady_s,
            "sent": dict(self.sent),
            "failures": dict(self.failures),
            **({"runtime": vars(self.runtime)} if self.runtime else {}),
            "latency_s": {
                op: {"p50": self.percentile(op, 50), "p99": self.percentile(op, 99)}
                for op in sorted(self.latencies)
            },
        }

    def summary(self) -> str:
        sent = ", ".join(f"{op} {count}" for op, count in sorted(self.sent.items()))
        lines = [
            f"simulated {self.enrolled}/{self.nodes} nodes: enrolled in {self.enroll_s:.1f}s, "
            f"then published for {self.steady_s:.1f}s; sent: {sent or 'nothing'}; "
            f"errors: {self.errors}"
        ]
        if self.runtime is not None:
            r = self.runtime
            lines.append(
                f"runtime: {r.reports} reports, {r.acquisitions} acquisitions, {r.loads} loads,"
                f" {r.invokes} invokes"
                f" ({r.tokens} tokens, {r.refused} refused, {r.cut} cut by a drain)"
            )
        lines += [f"  {count} x {key}" for key, count in self.failures.most_common()]
        return "\n".join(lines)


class SimulatedHost:
    def __init__(self, hostname: str, seed: str, artifact_roots: list[str] | None = None) -> None:
        self.hostname = hostname
        self.artifact_roots = artifact_roots or []
        self._random = random.Random(seed)
        self._ram_used = self._random.uniform(0.1, 0.5) * RAM

    def facts(self) -> HostFacts:
        return HostFacts(
            hostname=self.hostname,
            os="Simulated Linux 24.04",
            kernel="6.8.0-simulated",
            cpu_model="Simulated CPU @ 3.0GHz",
            cpu_count=64,
            ram_total_bytes=RAM,
            storage_total_bytes=DISK,
            artifact_roots=self.artifact_roots,
        )

    def telemetry(self) -> HostTelemetry:
        self._ram_used = min(
            0.95 * RAM, max(0.05 * RAM, self._ram_used * self._random.uniform(0.95, 1.05))
        )
        return HostTelemetry(
            ram_total_bytes=RAM,
            ram_used_bytes=int(self._ram_used),
            storage=[StorageTelemetry(path="/", total_bytes=DISK, used_bytes=DISK // 3)],
        )


class Fleet:
    def __init__(self, options: SimOptions) -> None:
        self.options = options
        self.stats = Stats(latencies={})
        self.stops: list[asyncio.Event] = []
        self.enrolled = 0
        self.stopping = asyncio.Event()
        self.runtime_counters = RuntimeCounters() if options.runtime else None
        # The held requests' pool (runtime channels, invoke answer streams), set by run.
        self.streams_http: httpx.AsyncClient | None = None

    def _failed(self, operation: str) -> Callable[[RequestFailed], None]:
        def count(error: RequestFailed) -> None:
            status = error.status if error.status is not None else "-"
            self.stats.failures[f"{operation} {error.failure_class.value} {status}"] += 1

        return count

    async def _node(
        self,
        index: int,
        http_limiter: asyncio.Semaphore,
        enroll_limiter: asyncio.Semaphore,
        operator: OperatorClient,
        client: ProtocolClient,
        all_enrolled: asyncio.Event,
    ) -> None:
        options = self.options
        name = f"sim-{options.run_id}-{index:04d}"

        async with enroll_limiter:
            token = await retry_transient(
                "create token",
                lambda: operator.create_token(
                    CreateEnrollmentToken(
                        labels={
                            **options.labels,
                            "simulated": "true",
                            "sim-run": options.run_id,
                        },
                        display_name=name,
                        expires_in_s=3600,
                    )
                ),
                stop=self.stopping,
                initial_s=0.5,
                max_s=10,
                on_failure=self._failed("create token"),
            )
            answer = await retry_transient(
                "enroll",
                lambda: client.enroll(
                    EnrollRequest(
                        enrollment_token=token.secret,
                        protocol_version=PROTOCOL_VERSION,
                        agent_version=AGENT_VERSION,
                        hostname=name,
                        capabilities=list(CAPABILITIES),
                    )
                ),
                stop=self.stopping,
                initial_s=0.5,
                max_s=10,
                on_failure=self._failed("enroll"),
            )
        self.stats.sent["enroll"] += 1
        self.enrolled += 1
        if self.enrolled == options.nodes:
            all_enrolled.set()
        node_client = ProtocolClient(client.http, answer.credential, limiter=http_limiter)
        stop = asyncio.Event()
        self.stops.append(stop)
        # Publishing starts at once, as a real agent's does: a node left silent until the
        # whole fleet is in would go stale at the larger sizes before its first heartbeat.
        # The steady state is measured apart all the same: latencies restart when the
        # last node is in (the `publishing:` line), after a warm-up.
        if self.stopping.is_set():
            return
        runtime = options.runtime
        publisher = Publisher(
            client=node_client,
            node_id=answer.node_id,
            sequences=Sequences(None),
            collector=SimulatedCollector(
                str(answer.node_id), runtime.devices if runtime else options.gpus
            ),
            host=SimulatedHost(
                name, str(answer.node_id), [runtime.artifact_root] if runtime else []
            ),
            timing=Timing(
                heartbeat_interval_s=options.heartbeat_interval_s,
                telemetry_interval_s=options.telemetry_interval_s,
                # Checked at this interval, sent on change, and in full every 600 s, as
                # a real agent's defaults do (agent/config.py).
                inventory_check_interval_s=options.inventory_interval_s,
                inventory_interval_s=max(600.0, options.inventory_interval_s),
                retry_initial_s=0.5,
                retry_max_s=10,
            ),
            server_heartbeat_interval_s=answer.heartbeat_interval_s,
            name=name,
            stats=self.stats,
            stagger_s=options.heartbeat_interval_s,
        )
        if runtime is not None and self.streams_http is not None:
            sim = SimRuntime(
                answer.node_id,
                runtime,
                node_client,
                ProtocolClient(self.streams_http, answer.credential),
                counters=self.runtime_counters,
                on_failure=lambda what, exc: self._failed(what)(exc),
            )
            runner = asyncio.create_task(sim.run(stop))
            try:
                error = await publisher.run(stop)
            finally:
                stop.set()
                await runner
        else:
            error = await publisher.run(stop)
        if error is not None:
            logger.error("%s: this simulated node stopped (%s)", name, type(error).__name__)

    async def run(self) -> SimReport:
        options = self.options
        limiter = asyncio.Semaphore(options.concurrency)
        enroll_limiter = asyncio.Semaphore(min(options.enroll_concurrency, options.concurrency))
        all_enrolled = asyncio.Event()
        if options.nodes == 0:
            all_enrolled.set()
        started = time.monotonic()
        # Several small connection pools rather than one large one: httpcore matches
        # every queued request against every connection on each event, which made one
        # 64-connection pool the simulator's own bottleneck at a thousand nodes.
        shards = max(1, options.concurrency // POOL_SIZE)
        async with contextlib.AsyncExitStack() as pools:
            https = [
                await pools.enter_async_context(
                    make_http_client(
                        options.api_url,
                        tls=options.tls,
                        timeout_s=options.request_timeout_s,
                        max_connections=max(1, options.concurrency // shards),
                        trust_env=False,
                    )
                )
                for _ in range(shards)
            ]
            if options.runtime is not None:
                # Held requests (a channel per node, an answer stream per invoke): one
                # connection each, outside the bound that keeps the short ones moving.
                self.streams_http = await pools.enter_async_context(
                    make_http_client(
                        options.api_url,
                        tls=options.tls,
                        timeout_s=options.request_timeout_s,
                        # A channel per node, and an answer stream per invoke in flight.
                        max_connections=1024 + 2 * options.nodes,
                        trust_env=False,
                    )
                )
            limiters = [
                asyncio.Semaphore(max(1, options.concurrency // shards)) for _ in range(shards)
            ]
            operator = OperatorClient(https[0], options.operator_key, limiter=limiter)
            clients = [
                ProtocolClient(http, limiter=shard_limiter)
                for http, shard_limiter in zip(https, limiters, strict=True)
            ]
            tasks = [
                asyncio.create_task(
                    self._node(
                        i,
                        limiters[i % shards],
                        enroll_limiter,
                        operator,
                        clients[i % shards],
                        all_enrolled,
                    )
                )
                for i in range(options.nodes)
            ]
            waiter = asyncio.create_task(all_enrolled.wait())
            stopper = asyncio.create_task(self.stopping.wait())
            # Enrollment phase: until every node is in, a node task failed, or a stop.
            pending: set[asyncio.Task[Any]] = {*tasks, waiter, stopper}
            failed_early = False
            while not all_enrolled.is_set() and not self.stopping.is_set():
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if task in tasks and task.exception() is not None:
                        failed_early = True
                if failed_early:
                    break
            enrolled_at = time.monotonic()
            # Latencies of the steady state only.
            if self.stats.latencies is not None:
                self.stats.latencies.clear()
            # On stdout, so a benchmark driving this process knows the steady state began.
            print(
                f"publishing: {self.enrolled}/{options.nodes} nodes enrolled in"
                f" {enrolled_at - started:.1f}s",
                flush=True,
            )
            if options.latency_warmup_s > 0 and self.stats.latencies is not None:
                latencies = self.stats.latencies
                asyncio.get_running_loop().call_later(options.latency_warmup_s, latencies.clear)
            if not failed_early and not self.stopping.is_set() and options.duration_s > 0:
                await interruptible_sleep(self.stopping, options.duration_s)
            elif not failed_early and not self.stopping.is_set():
                await self.stopping.wait()
            finished = time.monotonic()
            self.stopping.set()
            for stop in self.stops:
                stop.set()
            waiter.cancel()
            stopper.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException) and not isinstance(result, Stopped):
                    if isinstance(result, RequestFailed):
                        logger.error("%s", failure_line("simulated node", result, "gave up"))
                    else:
                        logger.error("simulated node failed: %r", result)
                        self.stats.failures["simulator internal"] += 1
        return SimReport(
            nodes=options.nodes,
            enrolled=self.enrolled,
            enroll_s=enrolled_at - started,
            steady_s=finished - enrolled_at,
            sent=self.stats.sent,
            failures=self.stats.failures,
            latencies=self.stats.latencies or {},
            runtime=self.runtime_counters,
        )


def _target(args: argparse.Namespace) -> tuple[str, str]:
    """(API URL, operator key): the flags, then the environment, then the stack file of
    the running `modelforge up`; never a default port where another API may answer."""
    api_url: str | None = args.api_url
    key = args.operator_key or os.environ.get("MODELFORGE_OPERATOR_API_KEY", "")
    if api_url is None or not key:
        try:
            info = read_stack_info()
            api_url = api_url or info.api_url
            key = key or operator_key_from(info)
        except StackFileError as exc:
            missing = "--api-url" if api_url is None else "--operator-key"
            raise SystemExit(f"modelforge simulate: {missing} is needed: {exc}") from None
    return api_url, key


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise SystemExit(f"modelforge simulate: --label {text!r} is not KEY=VALUE")
    return key, value


def runtime_options(args: argparse.Namespace) -> RuntimeOptions | None:
    """The simulated runtime workers' settings from the flags (cli/main.py), or None
    without --runtime."""
    if not args.runtime:
        return None
    return RuntimeOptions(
        devices=args.devices_per_node if args.devices_per_node is not None else args.gpus,
        device_memory_bytes=int(args.device_memory_gib * GIB),
        tokens_per_s=args.tokens_per_s,
        load_s=args.load_s,
        acquire_s=args.acquire_s,
        report_interval_s=args.runtime_report_interval,
        job_poll_interval_s=args.job_poll_interval,
    )


def run_simulate(args: argparse.Namespace) -> int:
    try:
        api_url, key = _target(args)
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    configure_logging(args.log_level)
    options = SimOptions(
        nodes=args.nodes,
        api_url=api_url,
        operator_key=key,
        duration_s=args.duration,
        heartbeat_interval_s=args.heartbeat_interval,
        telemetry_interval_s=args.telemetry_interval,
        inventory_interval_s=args.inventory_interval,
        gpus=args.gpus,
        concurrency=args.concurrency,
        latency_warmup_s=args.latency_warmup,
        runtime=runtime_options(args),
        labels=dict(_label(text) for text in args.label or []),
        tls=TlsOptions(
            Path(args.ca_bundle) if args.ca_bundle else None,
            Path(args.client_cert) if args.client_cert else None,
            Path(args.client_key) if args.client_key else None,
        ),
    )

    async def main() -> SimReport:
        fleet = Fleet(options)
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, fleet.stopping.set)
        return await fleet.run()

    print(
        f"simulating {options.nodes} nodes against {options.api_url} (run {options.run_id})",
        flush=True,
    )
    report = asyncio.run(main())
    print(report.summary(), flush=True)
    if args.report_json is not None:
        Path(args.report_json).write_text(json.dumps(report.as_json()))
    return 0 if report.errors == 0 and report.enrolled == report.nodes else 1
