"""The three publishing loops of one node: heartbeat, inventory and telemetry.

* heartbeat: at the interval the server asks for (or the configured one);
* inventory: at start, whenever a collection differs from the last one sent, and at least
  every inventory_interval_s;
* telemetry: every telemetry_interval_s.

Each publication is retried by tenacity with exponential backoff and full jitter, for
transient failures only (transport errors, 5xx, 429; Retry-After is honoured), at most
retry_max_attempts times: then it is dropped with one log line and the loop goes on at
its next interval. Every attempt is built afresh: a new observation and a new sequence
number, so old state is never resent once newer state exists, and a retry never replays
a sequence even when the earlier attempt reached the server. The backoff of a stream
keeps growing across dropped publications until one gets through.

Any other 4xx (400, 404, 413, 422, a 409 other than the fatal ones) is final for that
payload: one log line, no retry, and the next publication goes at the next interval with
the next sequence number (an inventory refused as it is is not sent again until it
changes or is due). A replayed sequence (409 sequence_replayed) means the local cursor
is behind the server's (a restored state dir): the cursor jumps past the server's, is
persisted, and the sample is sent again (agent/sequencing.py, the rule of every stream
the node sends).

401/403 and fatal 409s stop all three loops; `run` returns that error. Nothing is sent
after the stop event is set.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, cast

from agent import AGENT_VERSION, CAPABILITIES
from agent.client import ProtocolClient
from agent.collectors.base import GpuCollector
from agent.collectors.host import HostTelemetry
from agent.diagnostics import failure_line
from agent.errors import (
    AgentError,
    Rejected,
    RejectionKind,
    RequestFailed,
    Transient,
    advice_for,
    final_for_payload,
    stops_publishing,
)
from agent.retry import Stopped, interruptible_sleep, retry_transient
from agent.sequencing import send_sequenced
from agent.state import Sequences
from schemas.agent import (
    PROTOCOL_VERSION,
    HeartbeatRequest,
    HostFacts,
    IngestResult,
    InventoryReport,
    TelemetryReport,
)
from schemas.errors import ErrorCode

logger = logging.getLogger("modelforge.agent")

DEFAULT_HEARTBEAT_INTERVAL_S = 10.0


class HostSource(Protocol):
    def facts(self) -> HostFacts: ...

    def telemetry(self) -> HostTelemetry: ...


@dataclass
class Timing:
    # None: follow the server (enroll and heartbeat answers carry the interval).
    heartbeat_interval_s: float | None = None
    telemetry_interval_s: float = 15.0
    inventory_check_interval_s: float = 30.0
    inventory_interval_s: float = 600.0
    retry_initial_s: float = 0.5
    retry_max_s: float = 30.0
    # Attempts at one publication on transient failures before it is dropped.
    retry_max_attempts: int = 5


@dataclass
class Stats:
    """What one publisher did; the fleet simulator adds them up."""

    sent: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)
    # Seconds from first attempt to success, per operation, when asked for (simulator).
    latencies: dict[str, list[float]] | None = None

    @property
    def failed(self) -> int:
        return sum(self.failures.values())


class _Fatal(Exception):
    def __init__(self, error: AgentError) -> None:
        super().__init__(str(error))
        self.error = error


# Called with the rejection; True when a replacement credential was installed meanwhile.
CredentialReload = Callable[[Rejected, int], Awaitable[bool]]


class Publisher:
    def __init__(
        self,
        *,
        client: ProtocolClient,
        node_id: uuid.UUID,
        sequences: Sequences,
        collector: GpuCollector,
        host: HostSource,
        timing: Timing,
        server_heartbeat_interval_s: float | None = None,
        reload_credential: CredentialReload | None = None,
        name: str = "",
        stats: Stats | None = None,
        stagger_s: float = 0.0,
    ) -> None:
        self.client = client
        self.node_id = node_id
        self.sequences = sequences
        self.collector = collector
        self.host = host
        self.timing = timing
        self.server_heartbeat_interval_s = server_heartbeat_interval_s
        self.reload_credential = reload_credential
        self.prefix = f"{name}: " if name else ""
        self.stats = stats or Stats()
        # Spread many publishers over this window instead of starting all at once.
        self.stagger_s = stagger_s
        # Bumped whenever the credential is replaced, so concurrent 401s reload once.
        self.credential_generation = 0
        self._stop = asyncio.Event()
        self._not_applied: dict[str, str | None] = {}
        # Transient failures in a row per loop, so backoff grows across dropped payloads.
        self._transient_streak: Counter[str] = Counter()
        # The last inventory sent (as JSON), when the next periodic one is due, and the
        # last collection problem logged.
        self._inventory_sent = ""
        self._inventory_due = 0.0
        self._inventory_problem: str | None = None

    # --- the loop machinery ------------------------------------------------------------

    @property
    def heartbeat_interval_s(self) -> float:
        return (
            self.timing.heartbeat_interval_s
            or self.server_heartbeat_interval_s
            or DEFAULT_HEARTBEAT_INTERVAL_S
        )

    async def run(self, stop: asyncio.Event) -> AgentError | None:
        """Publish until stop is set (None) or the control plane refuses us (the error)."""
        self._stop = stop
        tasks = [
            asyncio.create_task(self._loop("heartbeat", self._heartbeat, self._heartbeat_wait)),
            asyncio.create_task(
                self._loop(
                    "inventory", self._inventory, lambda: self.timing.inventory_check_interval_s
                )
            ),
            asyncio.create_task(
                self._loop("telemetry", self._telemetry, lambda: self.timing.telemetry_interval_s)
            ),
        ]
        stopper = asyncio.create_task(stop.wait())
        fatal: AgentError | None = None
        try:
            pending: set[asyncio.Task[Any]] = set(tasks)
            while pending:
                done, pending = await asyncio.wait(
                    pending | {stopper}, return_when=asyncio.FIRST_COMPLETED
                )
                if stopper in done:
                    # Stop now: an in-flight request is abandoned, not waited for.
                    break
                pending.discard(stopper)
                for task in done:
                    error = cast(AgentError | None, task.result())
                    if error is not None and fatal is None:
                        fatal = error
                        stop.set()
        finally:
            stopper.cancel()
            for task in tasks:
                task.cancel()
            await asyncio.gather(stopper, *tasks, return_exceptions=True)
        return fatal

    def _heartbeat_wait(self) -> float:
        return self.heartbeat_interval_s

    async def _loop(
        self,
        operation: str,
        publish_once: Callable[[], Awaitable[bool]],
        interval: Callable[[], float],
    ) -> AgentError | None:
        if self.stagger_s > 0:
            await self._sleep(random.uniform(0, min(self.stagger_s, interval())))
        while not self._stop.is_set():
            try:
                await self._publish(operation, publish_once)
            except Stopped:
                return None
            except _Fatal as fatal:
                return fatal.error
            await self._sleep(interval())
        return None

    async def _sleep(self, seconds: float) -> None:
        await interruptible_sleep(self._stop, seconds)

    async def _publish(self, operation: str, publish_once: Callable[[], Awaitable[bool]]) -> None:
        while True:
            generation = self.credential_generation
            started = time.monotonic()
            try:
                sent = await retry_transient(
                    operation,
                    publish_once,
                    stop=self._stop,
                    initial_s=self.timing.retry_initial_s,
                    max_s=self.timing.retry_max_s,
                    prefix=self.prefix,
                    on_failure=lambda error: self._count_failure(operation, error),
                    max_attempts=self.timing.retry_max_attempts,
                    earlier_failures=self._transient_streak[operation],
                )
                self._transient_streak[operation] = 0
                if sent:
                    self.stats.sent[operation] += 1
                    if self.stats.latencies is not None:
                        latency = time.monotonic() - started
                        self.stats.latencies.setdefault(operation, []).append(latency)
                    logger.debug("%s%s published", self.prefix, operation)
                return
            except Rejected as error:
                if self._stop.is_set():
                    raise Stopped from None
                if await self._credential_replaced(error, generation):
                    continue
                if self._stop.is_set():
                    raise Stopped from None
                self._log_rejection(operation, error)
                raise _Fatal(error) from None
            except Transient as error:
                # Its retries are spent. Every attempt was a fresh sample, and the next
                # interval brings a newer one: nothing is lost by dropping this one.
                outcome = (
                    f"gave up after {self.timing.retry_max_attempts} attempts; dropped, "
                    "newer state is sent at the next interval"
                )
                logger.error("%s%s", self.prefix, failure_line(operation, error, outcome))
                return
            except RequestFailed as error:
                if stops_publishing(error):
                    logger.error(
                        "%s%s",
                        self.prefix,
                        failure_line(operation, error, f"stopping: {advice_for(error)}"),
                    )
                    raise _Fatal(error) from None
                # A 4xx: sending it again cannot help. The next payload takes the next
                # sequence number, so it is not refused as a replay of this one.
                outcome = "final for this payload: dropped, not retried; the next one follows"
                logger.error("%s%s", self.prefix, failure_line(operation, error, outcome))
                return

    def _count_failure(self, operation: str, error: RequestFailed) -> None:
        status = error.status if error.status is not None else "-"
        self.stats.failures[f"{operation} {error.failure_class.value} {status}"] += 1
        # Only unreachability grows the backoff: any answer proves the API is back.
        if isinstance(error, Transient):
            self._transient_streak[operation] += 1
        else:
            self._transient_streak[operation] = 0

    async def _credential_replaced(self, error: Rejected, generation: int) -> bool:
        if error.kind not in (RejectionKind.REVOKED, RejectionKind.INVALID):
            return False
        if self.reload_credential is None:
            return False
        replaced = await self.reload_credential(error, generation)
        if replaced and self.credential_generation == generation:
            self.credential_generation += 1
        return replaced

    def _log_rejection(self, operation: str, error: Rejected) -> None:
        logger.error(
            "%s%s",
            self.prefix,
            failure_line(
                operation,
                error,
                f"the control plane rejected this node ({error.kind.value}); publishing stopped",
            ),
        )

    # --- what is published -------------------------------------------------------------

    async def _heartbeat(self) -> bool:
        answer = await self.client.heartbeat(
            HeartbeatRequest(
                node_id=self.node_id,
                protocol_version=PROTOCOL_VERSION,
                agent_version=AGENT_VERSION,
                capabilities=list(CAPABILITIES),
                observed_at=_now(),
            )
        )
        if answer.heartbeat_interval_s != self.server_heartbeat_interval_s:
            if self.timing.heartbeat_interval_s is None:
                logger.info(
                    "%sheartbeat interval set by the control plane: %.3gs",
                    self.prefix,
                    answer.heartbeat_interval_s,
                )
            self.server_heartbeat_interval_s = answer.heartbeat_interval_s
        return True

    async def _sequenced(
        self, stream: str, send: Callable[[int], Awaitable[IngestResult]]
    ) -> IngestResult:
        result = await send_sequenced(self.sequences, stream, send, prefix=self.prefix)
        self._note_applied(stream, result)
        return result

    def _note_applied(self, stream: str, result: IngestResult) -> None:
        reason = result.reason.value if result.reason is not None else None
        if reason != self._not_applied.get(stream):
            if reason is not None:
                logger.warning(
                    "%s%s sample %d kept out of last-good state by the control plane: %s "
                    "(check this host's clock)",
                    self.prefix,
                    stream,
                    result.sequence,
                    reason,
                )
            elif stream in self._not_applied:
                logger.info("%s%s samples are applied again", self.prefix, stream)
        self._not_applied[stream] = reason

    async def _inventory(self) -> bool:
        """Send the inventory if it changed or is due; whether it was sent."""
        # In a thread: NVML and disk statistics can block on a sick device.
        collection = await asyncio.to_thread(self.collector.inventory)
        facts = await asyncio.to_thread(self.host.facts)
        observed_at = _now()
        fingerprint = json.dumps(
            {
                "complete": collection.complete,
                "host": facts.model_dump(mode="json"),
                "gpus": [gpu.model_dump(mode="json") for gpu in collection.gpus],
            },
            sort_keys=True,
        )
        now = time.monotonic()
        if fingerprint == self._inventory_sent and now < self._inventory_due:
            return False
        if collection.problem and collection.problem != self._inventory_problem:
            logger.warning(
                "%sGPU inventory incomplete (%s): sent with complete=false, so the control "
                "plane keeps its last-good GPU state",
                self.prefix,
                collection.problem,
            )
        self._inventory_problem = collection.problem

        async def send(sequence: int) -> IngestResult:
            return await self.client.put_inventory(
                InventoryReport(
                    node_id=self.node_id,
                    sequence=sequence,
                    observed_at=observed_at,
                    complete=collection.complete,
                    host=facts,
                    gpus=collection.gpus,
                )
            )

        try:
            await self._sequenced("inventory", send)
        except RequestFailed as error:
            # Refused as it is: the same inventory again would be refused again. (A replay
            # refused the sequence number, not the inventory: that goes at the next check.)
            if final_for_payload(error) and error.code != ErrorCode.SEQUENCE_REPLAYED:
                self._inventory_sent = fingerprint
                self._inventory_due = now + self.timing.inventory_interval_s
            raise
        if self._inventory_sent and fingerprint != self._inventory_sent:
            logger.info("%sinventory changed; sent", self.prefix)
        self._inventory_sent = fingerprint
        self._inventory_due = now + self.timing.inventory_interval_s
        return True

    async def _telemetry(self) -> bool:
        host = await asyncio.to_thread(self.host.telemetry)
        gpus = await asyncio.to_thread(self.collector.telemetry)
        observed_at = _now()

        async def send(sequence: int) -> IngestResult:
            return await self.client.put_telemetry(
                TelemetryReport(
                    node_id=self.node_id,
                    sequence=sequence,
                    observed_at=observed_at,
                    ram_total_bytes=host.ram_total_bytes,
                    ram_used_bytes=host.ram_used_bytes,
                    storage=host.storage,
                    gpus=gpus,
                )
            )

        await self._sequenced("telemetry", send)
        return True


def _now() -> datetime:
    return datetime.now(UTC)
