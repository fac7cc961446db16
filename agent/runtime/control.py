"""The runtime worker's side of the protocol, outbound only, with the node's credential
from the agent's state dir: the runtime report stream, and the runtime jobs.

* **Report** (`PUT …/agent/runtime`): devices, served and loaded models, queue depths
  and the binary it runs (its sha256 and version: a RuntimeEnvironment). Sent at start,
  every `report_interval_s`, and soon after anything changed. Its sequences are the
  agent's (agent/state.py: Sequences, reserved in blocks in a cursor file in the run dir,
  so a restart never reuses one) under the agent's replay rule (agent/sequencing.py).
* **Jobs** of every runtime kind are claimed from `…/runtime-probes/next`, and those of
  every deployment kind (agent/runtime/deployments.py) from `…/deployment-jobs/next`,
  each by its own claim loop (agent/jobs/loop.py) when a job's notification wakes it
  or every `job_poll_interval_s`. Jobs run side by side, each as its own task, up to
  one per device plus one per loop: a job for a device waits for that device's turn
  (DeviceSlot), never for a job on another device.
* **The channel** (agent/runtime/channel.py): one held request carries the job notes
  that wake the loops, and the invokes, each started at once (agent/runtime/invoke.py).
* A 4xx answer is final for that request: logged once, never retried in a loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import subprocess
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from agent.client import ProtocolClient
from agent.errors import RequestFailed, StateError, log_unexpected
from agent.jobs.dispatch import FamilyJobs, declared_in
from agent.jobs.loop import claim_loop
from agent.jobs.wakeups import Wakeups, wait_for_wake
from agent.runtime.channel import RuntimeChannel
from agent.runtime.invoke import Invokes
from agent.runtime.worker import RuntimeWorker
from agent.sequencing import send_sequenced
from agent.state import CursorFile, Sequences
from schemas.agent import IngestResult
from schemas.deployments import DEPLOYMENT_FAMILY
from schemas.protocol import StreamName
from schemas.runtime import RUNTIME_FAMILY, EnvironmentReport
from schemas.runtime_local import RuntimeReport

logger = logging.getLogger("modelforge.runtime.control")

# The report stream's cursor in the run dir (agent/state.py: CursorFile), and the file
# a worker before it kept instead: the end of its reserved block, one number.
CURSORS_FILE = "runtime.cursors.json"
EARLIER_SEQUENCE_FILE = "runtime.sequence"
STREAMS: tuple[str, ...] = (StreamName.RUNTIME,)
# The package whose modules declare the executors of the runtime and deployment kinds
# the runtime worker runs (agent/jobs/dispatch.py: declared_in).
EXECUTORS_PACKAGE: Final = "agent.runtime"


def runtime_sequences(run_dir: Path) -> Sequences:
    """The report stream's sequences, persisted in the run dir. A worker upgraded in
    place takes over its earlier sequence file first, so it never reuses a number it
    sent; a file it cannot read starts the stream over, as a lost run dir does (the
    server's replay answer moves it past)."""
    cursors = CursorFile(run_dir / CURSORS_FILE, STREAMS)
    earlier = run_dir / EARLIER_SEQUENCE_FILE
    if earlier.exists():
        if not cursors.path.exists():
            try:
                mark = int(earlier.read_text().strip() or 0)
            except (OSError, ValueError):
                mark = 0
            cursors.save_cursors({StreamName.RUNTIME: max(mark, 0)})
        earlier.unlink()
    try:
        cursors.load_cursors()
    except StateError as exc:
        logger.warning("%s: the report stream starts over", exc)
        cursors.save_cursors(dict.fromkeys(STREAMS, 0))
    return Sequences(cursors, streams=STREAMS)


def binary_environment(binary: Path, backend: str) -> EnvironmentReport:
    """The binary's digest and what it says its version is (`--version`)."""
    digest = hashlib.sha256(binary.read_bytes()).hexdigest()
    try:
        result = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=30, check=False
        )
        lines = (result.stdout + result.stderr).strip().splitlines()
        version = next((line for line in lines if line.startswith("version:")), "unknown")
    except (OSError, subprocess.TimeoutExpired):
        version = "unknown"
    return EnvironmentReport(
        binary_sha256=digest, version=version.removeprefix("version:").strip()[:200] or "?",
        backend="cuda" if backend == "cuda" else "cpu",
    )  # fmt: skip


class ControlPlane:
    def __init__(
        self,
        worker: RuntimeWorker,
        client: ProtocolClient,
        node_id: uuid.UUID,
        environment: EnvironmentReport,
        credential: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.worker = worker
        self.client = client
        self.node_id = node_id
        self.environment = environment
        self.sequences = runtime_sequences(worker.config.run_dir)
        # Read again before every report: the agent may have installed a rotated one.
        self._credential = credential
        self.changed = worker.changed
        self._refused: str | None = None
        self.runtime_jobs = FamilyJobs(
            client, RUNTIME_FAMILY, declared_in(EXECUTORS_PACKAGE, RUNTIME_FAMILY), worker
        )
        self.deployment_jobs = FamilyJobs(
            client, DEPLOYMENT_FAMILY, declared_in(EXECUTORS_PACKAGE, DEPLOYMENT_FAMILY), worker
        )
        self.invokes = Invokes(worker, client)

    def report(self, sequence: int) -> RuntimeReport:
        inventory = self.worker.inventory()
        return RuntimeReport(
            node_id=self.node_id,
            sequence=sequence,
            observed_at=datetime.now(UTC),
            devices=inventory.devices,
            served_models=inventory.served_models,
            loaded_models=inventory.loaded_models,
            deployments=inventory.deployments,
            environments=[self.environment],
        )

    async def send_report(self) -> bool:
        current = await asyncio.to_thread(self._credential)
        if current and current != self.client.credential:
            logger.info("using the node's new credential from the agent's state dir")
            self.client.credential = current

        async def put(sequence: int) -> IngestResult:
            return await self.client.put_runtime(self.report(sequence))

        try:
            await send_sequenced(self.sequences, StreamName.RUNTIME, put)
        except RequestFailed as exc:
            kind = f"{type(exc).__name__}: {exc}"
            if self._refused != kind:
                logger.warning("the runtime report was not accepted (%s)", exc)
            self._refused = kind
            return False
        self._refused = None
        return True

    async def reports(self, stop: asyncio.Event) -> None:
        interval = self.worker.config.report_interval_s
        while not stop.is_set():
            try:
                await self.send_report()
            except Exception as exc:
                # The report is the node's runtime state for the control plane: a
                # report that cannot be built this time must not end the next ones.
                log_unexpected(logger, "the runtime report could not be sent", exc)
            await wait_for_wake(stop, self.changed, interval)
            await asyncio.sleep(0.2)  # a burst of changes is one report

    @property
    def in_flight(self) -> int:
        """Jobs run at once: one per device, plus one (a job that fails at once, or a
        health check, need not wait for a device's long job to end)."""
        return len(self.worker.slots) + 1

    async def jobs(
        self, stop: asyncio.Event, wake: asyncio.Event, served: FamilyJobs[RuntimeWorker]
    ) -> None:
        """The claim loop of one family's jobs."""
        await claim_loop(
            served.what,
            served.next_job,
            stop,
            poll_s=self.worker.config.job_poll_interval_s,
            wake=wake,
            in_flight=self.in_flight,
        )

    async def run(self, stop: asyncio.Event) -> None:
        wakeups = Wakeups()
        channel = RuntimeChannel(self.client, wakeups, self.invokes)
        tasks = [
            asyncio.create_task(self.reports(stop)),
            *(
                asyncio.create_task(self.jobs(stop, wakeups.loop_for(served.family.kinds), served))
                for served in (self.runtime_jobs, self.deployment_jobs)
            ),
            asyncio.create_task(channel.hold(stop)),
        ]
        try:
            await stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            # No new invokes now; those in flight get the shutdown grace (the worker's
            # close then ends them, as it ends the local API's).
            await self.invokes.close(self.worker.config.shutdown_grace_s)
