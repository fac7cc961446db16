"""Simulated runtime workers for `modelforge simulate --runtime`: a fake at the hardware
edge, as agent/collectors/simulated.py fakes the GPUs. Everything above the edge is the
real protocol over HTTP, so thousands of nodes can hold deployments on two cores:

* **Report** (`PUT …/agent/runtime`, a RuntimeReport): the node's devices (`gpu:N`,
  backend cuda, the same UUIDs as its simulated GPUs) with their memory, which goes
  down by the model's size while a deployment is loaded, their queue depth (invokes in
  flight), one environment (a fixed "binary": SIM_BINARY's digest) and the deployments
  loaded here. Sent at start, every `report_interval_s`, and soon after a change.
* **The runtime channel** (schemas/protocol.py: RUNTIME_CHANNEL), held like the real
  worker's (agent/jobs/wakeups.py: hold_events) on a connection of its own: job notes
  wake the claim loops, invokes start at once, cancels stop them.
* **Deployment jobs** (load, health, drain, unload) under their leases through the one
  lease runner (agent/jobs/lease.py) and claim loop (agent/jobs/loop.py): a load
  takes `load_s`, then answers healthy; a drain refuses new invokes and waits for
  those in flight up to its deadline, then cuts the rest (their streams end with the
  error event, as a real unload's do).
* **Artifact jobs** (acquire, evict): completed after `acquire_s` as if the files were
  written under the node's one artifact root (the host facts offer it), so the control
  plane records them in the node's inventory exactly as after a real acquisition; a
  load then finds its file by path.
* **Invokes**: answered with generated tokens at `tokens_per_s`, in llama-server's
  shape for the endpoint (agent/sim_answers.py: chat or completion events, then
  `data: [DONE]`; or one whole answer; embeddings always whole), posted on the
  invoke's stream as the real worker posts llama-server's bytes. An endpoint the
  deployment's load did not declare is refused `endpoint_not_served` (404), as the
  real worker refuses it.

Requests go through the fleet's shared, bounded pool; the held channels and the invoke
streams, which last, go through a second pool without that bound (a slot held for a
stream's whole life would starve the heartbeats).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Generic, TypeVar

from pydantic import ValidationError

from agent.client import ProtocolClient
from agent.collectors.simulated import simulated_gpu_uuid
from agent.errors import RequestFailed
from agent.jobs.dispatch import Executor, FamilyJobs
from agent.jobs.lease import Failed, LeasedJob, Reports, report_every
from agent.jobs.loop import claim_loop
from agent.jobs.wakeups import Wakeups, hold_events, note_kind, wait_for_wake
from agent.sequencing import send_sequenced
from agent.sim_answers import Events, Generating, embeddings_answer, plain_answer, prompt_count
from agent.state import Sequences
from schemas.artifacts import (
    ARTIFACT_FAMILY,
    ArtifactClaim,
    CompleteReport,
    EvictClaim,
    EvictReport,
    FileProgress,
    ProgressReport,
)
from schemas.deployments import (
    DEPLOYMENT_FAMILY,
    DrainComplete,
    HealthComplete,
    LoadClaim,
    LoadComplete,
    ReportedDeployment,
    TargetClaim,
    UnloadComplete,
)
from schemas.endpoints import Endpoint, default_endpoints
from schemas.gateway import Invoke, InvokeCancel, InvokeRefusal
from schemas.gateway_endpoints import CompletionParams, EmbeddingParams
from schemas.jobs import FailReport, FailureCode, JobKind
from schemas.protocol import RUNTIME_CHANNEL, StreamName
from schemas.runtime import (
    EnvironmentReport,
    RuntimeFailure,
    RuntimeJobFail,
    RuntimeJobProgress,
    ServerHealth,
)
from schemas.runtime_local import RuntimeDevice, RuntimeReport, ServedModel

logger = logging.getLogger("modelforge.agent.sim_runtime")

GIB: Final = 2**30
# The simulated "llama-server": every simulated node reports this one environment.
SIM_BINARY: Final = b"modelforge simulated llama-server"
SIM_BINARY_SHA256: Final = hashlib.sha256(SIM_BINARY).hexdigest()
SIM_VERSION: Final = "simulated"
HEALTHY: Final = ServerHealth(process_up=True, health_ok=True, model_listed=True, inference_ok=True)
NOTHING: Final = ServerHealth(
    process_up=False, health_ok=False, model_listed=False, inference_ok=False
)
# What a model needs beyond its file's size on the device (KV cache, compute buffers).
MODEL_OVERHEAD_BYTES: Final = GIB // 2
# A file loaded without a known size (never acquired through this node) counts as this.
UNKNOWN_MODEL_BYTES: Final = 4 * GIB
# The answer cut by a drain's deadline: the event the real worker appends
# (agent/runtime/api.py: STREAM_FAILED).
STREAM_FAILED: Final = (
    b'data: {"error": {"message": "llama-server stopped mid-answer", '
    b'"type": "server_error", "code": "upstream_unavailable"}}\n\n'
)
STREAM_DONE: Final = b"data: [DONE]\n\n"
# Deliveries remembered for deduplication (agent/runtime/invoke.py does the same).
REMEMBERED: Final = 1024
# Tokens an answer has at most, whatever max_tokens asks.
MAX_ANSWER_TOKENS: Final = 4096


@dataclass(frozen=True)
class RuntimeOptions:
    devices: int = 2
    device_memory_bytes: int = 80 * GIB
    tokens_per_s: float = 50.0
    load_s: float = 2.0
    acquire_s: float = 0.5
    report_interval_s: float = 30.0
    job_poll_interval_s: float = 30.0
    artifact_root: str = "/srv/simulated-models"


def sim_environment() -> EnvironmentReport:
    return EnvironmentReport(binary_sha256=SIM_BINARY_SHA256, version=SIM_VERSION, backend="cuda")


@dataclass
class SimDeployment:
    """A deployment "loaded" on a simulated device, with its invokes in flight."""

    deployment_id: uuid.UUID
    device_id: str
    model: str
    max_concurrent: int
    memory_bytes: int
    endpoints: list[Endpoint] = field(default_factory=default_endpoints)
    draining: bool = False
    invokes: dict[uuid.UUID, asyncio.Task[str]] = field(default_factory=dict)
    # Set whenever an invoke ends (a drain waits on it).
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    # Set by a drain's deadline: the streams still running end with the error event.
    cut: asyncio.Event = field(default_factory=asyncio.Event)

    def reported(self) -> ReportedDeployment:
        return ReportedDeployment(
            deployment_id=self.deployment_id,
            device_id=self.device_id,
            model=self.model,
            state="draining" if self.draining else "ready",
            in_flight=len(self.invokes),
        )


@dataclass
class SimDevice:
    device_id: str
    uuid: str
    memory_total_bytes: int
    deployment: SimDeployment | None = None

    @property
    def memory_free_bytes(self) -> int:
        used = self.deployment.memory_bytes if self.deployment else 0
        return max(0, self.memory_total_bytes - used)


@dataclass
class RuntimeCounters:
    """What every simulated runtime of a fleet did (the simulator's summary)."""

    reports: int = 0
    loads: int = 0
    invokes: int = 0
    tokens: int = 0
    refused: int = 0
    cut: int = 0
    acquisitions: int = 0


class SimRuntime:
    """One node's simulated runtime worker."""

    def __init__(
        self,
        node_id: uuid.UUID,
        options: RuntimeOptions,
        client: ProtocolClient,
        streams: ProtocolClient,
        *,
        counters: RuntimeCounters | None = None,
        on_failure: Callable[[str, RequestFailed], None] | None = None,
    ) -> None:
        self.node_id = node_id
        self.options = options
        # Short requests (reports, claims, job reports): the fleet's bounded pool.
        self.client = client
        # Held requests (the channel, the invokes' answer streams): unbounded.
        self.streams = streams
        self.counters = counters or RuntimeCounters()
        self._on_failure = on_failure
        self.devices = [
            SimDevice(f"gpu:{i}", simulated_gpu_uuid(str(node_id), i), options.device_memory_bytes)
            for i in range(options.devices)
        ]
        self.deployments: dict[uuid.UUID, SimDeployment] = {}
        # The files written here by artifact jobs: their node path -> size.
        self.files: dict[str, int] = {}
        self.changed = asyncio.Event()
        self.sequences = Sequences(None, streams=(StreamName.RUNTIME,))
        self.running: dict[uuid.UUID, tuple[int, asyncio.Task[str]]] = {}
        self._seen: OrderedDict[tuple[uuid.UUID, int], None] = OrderedDict()
        self.deployment_jobs: FamilyJobs[SimRuntime] = FamilyJobs(
            client, DEPLOYMENT_FAMILY, DEPLOYMENT_EXECUTORS, self
        )
        self.artifact_jobs: FamilyJobs[SimRuntime] = FamilyJobs(
            client, ARTIFACT_FAMILY, ARTIFACT_EXECUTORS, self
        )

    # ------------------------------------------------------------------ the report

    def device(self, device_id: str) -> SimDevice | None:
        return next((d for d in self.devices if d.device_id == device_id), None)

    def report(self, sequence: int) -> RuntimeReport:
        devices = [
            RuntimeDevice(
                device_id=d.device_id,
                backend="cuda",
                name="NVIDIA H200 (simulated)",
                uuid=d.uuid,
                memory_total_bytes=d.memory_total_bytes,
                memory_free_bytes=d.memory_free_bytes,
                loaded_model=d.deployment.model if d.deployment else None,
                queue_depth=len(d.deployment.invokes) if d.deployment else 0,
            )
            for d in self.devices
        ]
        served = sorted({d.model for d in self.deployments.values()})
        return RuntimeReport(
            node_id=self.node_id,
            sequence=sequence,
            observed_at=datetime.now(UTC),
            devices=devices,
            served_models=[ServedModel(model_id=m) for m in served],
            loaded_models=served,
            deployments=[d.reported() for d in self.deployments.values()],
            environments=[sim_environment()],
        )

    async def send_report(self) -> None:
        try:
            await send_sequenced(
                self.sequences,
                StreamName.RUNTIME,
                lambda sequence: self.client.put_runtime(self.report(sequence)),
            )
        except RequestFailed as exc:
            self._failed("runtime report", exc)
        else:
            self.counters.reports += 1

    async def reports(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.changed.clear()
            await self.send_report()
            await wait_for_wake(stop, self.changed, self.options.report_interval_s)
            await asyncio.sleep(0.2)  # a burst of changes is one report

    def _failed(self, what: str, error: RequestFailed) -> None:
        if self._on_failure is not None:
            self._on_failure(what, error)
        else:
            logger.warning("%s: %s", what, error)

    # ------------------------------------------------------------------ the channel

    def on_event(self, event: str | None, data: str) -> None:
        if event == "job":
            self._wakeups.note(note_kind(data))
        elif event == "invoke":
            self.deliver(data)
        elif event == "cancel":
            with contextlib.suppress(ValidationError):
                current = self.running.get(InvokeCancel.model_validate_json(data).invoke_id)
                if current is not None:
                    current[1].cancel()

    def deliver(self, data: str) -> bool:
        """Start a delivered invoke at once; a second delivery of the same (id, epoch),
        or an older epoch than the one running, is dropped (as the real worker does)."""
        try:
            invoke = Invoke.model_validate_json(data)
        except ValidationError:
            logger.warning("an invoke delivery that is not an Invoke: dropped")
            return False
        key = (invoke.invoke_id, invoke.lease.epoch)
        if key in self._seen:
            return False
        self._seen[key] = None
        while len(self._seen) > REMEMBERED:
            self._seen.popitem(last=False)
        current = self.running.get(invoke.invoke_id)
        if current is not None:
            if current[0] > invoke.lease.epoch:
                return False
            current[1].cancel()
        task = asyncio.create_task(self.run_invoke(invoke))
        self.running[invoke.invoke_id] = (invoke.lease.epoch, task)
        task.add_done_callback(lambda done: self._invoke_ended(invoke.invoke_id, done))
        return True

    def _invoke_ended(self, invoke_id: uuid.UUID, task: asyncio.Task[str]) -> None:
        if self.running.get(invoke_id, (0, None))[1] is task:
            del self.running[invoke_id]
        if not task.cancelled() and task.exception() is not None:
            logger.error("invoke %s failed", invoke_id, exc_info=task.exception())

    # ------------------------------------------------------------------- the invokes

    async def run_invoke(self, invoke: Invoke) -> str:
        deployed = self.deployments.get(invoke.deployment_id)
        if deployed is None:
            return await self._refuse(invoke, 503, "deployment_not_loaded", "not loaded here")
        params = invoke.params
        endpoint = (
            params.endpoint if isinstance(params, CompletionParams | EmbeddingParams) else "chat"
        )
        if endpoint not in deployed.endpoints:
            return await self._refuse(invoke, 404, "endpoint_not_served", f"no {endpoint} here")
        if deployed.draining:
            return await self._refuse(invoke, 503, "deployment_draining", "no new invokes")
        if len(deployed.invokes) >= deployed.max_concurrent:
            return await self._refuse(invoke, 429, "deployment_busy", "at its bound")
        task = asyncio.current_task()
        assert task is not None
        deployed.invokes[invoke.invoke_id] = task
        self.changed.set()
        self.counters.invokes += 1
        try:
            body: bytes | AsyncIterator[bytes]
            content_type = "application/json"
            if isinstance(params, EmbeddingParams):
                # One forward pass per input, no generation: a token's time for them all.
                await asyncio.sleep(1.0 / self.options.tokens_per_s)
                body = embeddings_answer(params, deployed.model)
            else:
                tokens = max(1, min(params.max_tokens, MAX_ANSWER_TOKENS))
                if params.stream:
                    body = self._events(invoke.invoke_id, params, deployed, tokens)
                    content_type = "text/event-stream"
                else:
                    # A list's prompts are generated one after the other, as the real
                    # worker asks llama-server for them (agent/runtime/completion_list.py).
                    generated = tokens * prompt_count(params)
                    await asyncio.sleep(generated / self.options.tokens_per_s)
                    body = plain_answer(params, invoke.invoke_id, deployed.model, tokens)
                    self.counters.tokens += generated
            await self.streams.stream_invoke(
                invoke.invoke_id,
                invoke.lease,
                invoke.gateway,
                status=200,
                content_type=content_type,
                body=body,
            )
            return "relayed"
        except RequestFailed as exc:
            logger.info("invoke %s: the answer stream was not taken (%s)", invoke.invoke_id, exc)
            return "stream refused"
        finally:
            if deployed.invokes.get(invoke.invoke_id) is task:
                del deployed.invokes[invoke.invoke_id]
            deployed.ended.set()
            self.changed.set()

    async def _events(
        self, invoke_id: uuid.UUID, params: Generating, deployed: SimDeployment, tokens: int
    ) -> AsyncIterator[bytes]:
        """The answer's events at the configured rate, as llama-server streams them."""
        events = Events(params, invoke_id, deployed.model)
        head, tail = events.token_frame()
        interval = 1.0 / self.options.tokens_per_s
        start = time.monotonic()
        if (opening := events.opening()) is not None:
            yield opening
        for i in range(tokens):
            # Paced against the start, not the previous token: a late wake-up does not
            # slow the whole answer down.
            delay = start + (i + 1) * interval - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if deployed.cut.is_set():
                self.counters.cut += 1
                yield STREAM_FAILED
                return
            self.counters.tokens += 1
            yield b"%stok%d %s" % (head, i, tail)
        for event in events.ending(tokens):
            yield event
        yield STREAM_DONE

    async def _refuse(self, invoke: Invoke, status: int, code: Any, message: str) -> str:
        self.counters.refused += 1
        with contextlib.suppress(RequestFailed):
            await self.streams.stream_invoke(
                invoke.invoke_id,
                invoke.lease,
                invoke.gateway,
                status=status,
                content_type="application/json",
                body=InvokeRefusal(code=code, message=message).model_dump_json().encode(),
            )
        return f"refused {code}"

    # ---------------------------------------------------------------------- running

    async def run(self, stop: asyncio.Event) -> None:
        self._wakeups = Wakeups()
        poll = self.options.job_poll_interval_s
        loops = [
            (self.deployment_jobs, self._wakeups.loop_for(DEPLOYMENT_FAMILY.kinds)),
            (self.artifact_jobs, self._wakeups.loop_for(ARTIFACT_FAMILY.kinds)),
        ]
        tasks = [
            asyncio.create_task(self.reports(stop)),
            *(
                asyncio.create_task(
                    claim_loop(
                        served.what,
                        served.next_job,
                        stop,
                        poll_s=poll,
                        wake=wake,
                        in_flight=len(self.devices) + 1,
                    )
                )
                for served, wake in loops
            ),
            asyncio.create_task(
                hold_events(
                    self.streams,
                    [RUNTIME_CHANNEL],
                    stop,
                    on_open=self._wakeups.every,
                    on_event=self.on_event,
                    what="the simulated runtime channel",
                )
            ),
        ]
        try:
            await stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            for _, invoke in list(self.running.values()):
                invoke.cancel()
            await asyncio.gather(
                *tasks, *(t for _, t in self.running.values()), return_exceptions=True
            )


# ---------------------------------------------------------------------- the jobs


ClaimT = TypeVar("ClaimT", bound=LoadClaim | TargetClaim | ArtifactClaim | EvictClaim)
ProgressT = TypeVar("ProgressT")
DoneT = TypeVar("DoneT")
FailT = TypeVar("FailT")


class SimJob(LeasedJob[ProgressT, DoneT, FailT], Generic[ClaimT, ProgressT, DoneT, FailT]):
    """A simulated job under its claim's lease, with the runtime it acts on."""

    def __init__(
        self, claim: ClaimT, reports: Reports[ProgressT, DoneT, FailT], runtime: SimRuntime
    ) -> None:
        super().__init__(
            claim.job_id,
            claim.lease,
            reports,
            name=f"{claim.kind} {claim.job_id}",
            report_every_s=report_every(claim.lease),
        )
        self.claim = claim
        self.runtime = runtime


class SimDeploymentJob(SimJob[LoadClaim | TargetClaim, RuntimeJobProgress, Any, RuntimeJobFail]):
    cancelled_code = RuntimeFailure.CANCELLED
    internal_code = RuntimeFailure.INTERNAL

    # What the progress reports say it is doing (a str is immutable: a class default).
    phase: Any = "verifying"

    def progress_report(self) -> RuntimeJobProgress:
        return RuntimeJobProgress(lease=self.fence, phase=self.phase)

    def fail_report(self, failure: Failed) -> RuntimeJobFail:
        return RuntimeJobFail(
            lease=self.fence,
            code=RuntimeFailure(failure.code),
            retryable=failure.retryable,
            detail=failure.detail,
        )

    async def run(self) -> str:
        try:
            return await super().run()
        finally:
            self.runtime.changed.set()

    async def work(self) -> Any:
        claim = self.claim
        if isinstance(claim, LoadClaim):
            return await self._load(claim)
        deployed = self.runtime.deployments.get(claim.spec.deployment_id)
        if claim.kind == JobKind.DEPLOYMENT_HEALTH:
            return HealthComplete(
                kind=JobKind.DEPLOYMENT_HEALTH,
                lease=self.fence,
                health=HEALTHY if deployed else NOTHING,
                in_flight=len(deployed.invokes) if deployed else 0,
            )
        if deployed is None:
            if claim.kind == JobKind.DEPLOYMENT_DRAIN:
                return DrainComplete(
                    kind=JobKind.DEPLOYMENT_DRAIN, lease=self.fence, finished=0, cut=0
                )
            return UnloadComplete(kind=JobKind.DEPLOYMENT_UNLOAD, lease=self.fence, unloaded=False)
        finished, cut = await self._drain(deployed, claim.spec.deadline_s)
        if claim.kind == JobKind.DEPLOYMENT_DRAIN:
            return DrainComplete(
                kind=JobKind.DEPLOYMENT_DRAIN, lease=self.fence, finished=finished, cut=cut
            )
        return UnloadComplete(
            kind=JobKind.DEPLOYMENT_UNLOAD, lease=self.fence, unloaded=True, cut=cut
        )

    async def _load(self, claim: LoadClaim) -> LoadComplete:
        spec = claim.spec
        runtime = self.runtime
        started = time.monotonic()
        loaded = runtime.deployments.get(spec.deployment_id)
        if loaded is not None:
            return LoadComplete(lease=self.fence, device_id=loaded.device_id, health=HEALTHY,
                                load_s=0.0)  # fmt: skip
        device = runtime.device(spec.device_id)
        if device is None:
            raise Failed(RuntimeFailure.UNSUPPORTED_BACKEND, f"no device {spec.device_id}",
                         retryable=False)  # fmt: skip
        if device.deployment is not None:
            raise Failed(RuntimeFailure.DEVICE_PINNED,
                         f"{spec.device_id} serves {device.deployment.deployment_id}",
                         retryable=False)  # fmt: skip
        size = runtime.files.get(spec.artifact_path)
        if size is None:
            raise Failed(RuntimeFailure.ARTIFACT_MISSING, f"{spec.artifact_path} is not here",
                         retryable=False)  # fmt: skip
        need = size + MODEL_OVERHEAD_BYTES
        if need > device.memory_free_bytes:
            raise Failed(RuntimeFailure.OUT_OF_MEMORY,
                         f"needs {need} bytes, {device.memory_free_bytes} free",
                         retryable=False)  # fmt: skip
        self.phase = "loading"
        # The simulated load, stopping at a cancel or a lost lease as a real one does.
        deadline = started + runtime.options.load_s
        while (left := deadline - time.monotonic()) > 0:
            self.check()
            await asyncio.sleep(min(left, 0.5))
        self.check()
        if device.deployment is not None:  # another load took it meanwhile
            raise Failed(RuntimeFailure.DEVICE_PINNED, f"{spec.device_id} was taken",
                         retryable=False)  # fmt: skip
        deployed = SimDeployment(
            spec.deployment_id, spec.device_id, spec.model, spec.max_concurrent, need,
            endpoints=list(spec.endpoints),
        )  # fmt: skip
        device.deployment = deployed
        runtime.deployments[spec.deployment_id] = deployed
        runtime.counters.loads += 1
        runtime.changed.set()
        return LoadComplete(lease=self.fence, device_id=spec.device_id, health=HEALTHY,
                            load_s=min(time.monotonic() - started, 86_400))  # fmt: skip

    async def _drain(self, deployed: SimDeployment, deadline_s: float) -> tuple[int, int]:
        """No new invokes; those in flight get `deadline_s`, then the rest are cut (their
        streams end with the error event); then the "unload". (finished, cut)."""
        runtime = self.runtime
        if not deployed.draining:
            deployed.draining = True
            runtime.changed.set()
        self.phase = "draining"
        at_start = len(deployed.invokes)
        deadline = time.monotonic() + deadline_s
        while deployed.invokes and (left := deadline - time.monotonic()) > 0:
            self.check()
            deployed.ended.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(deployed.ended.wait(), min(left, 0.5))
        self.check()
        self.phase = "unloading"
        cut = list(deployed.invokes.values())
        if cut:
            deployed.cut.set()
            _, late = await asyncio.wait(cut, timeout=5.0)
            for task in late:
                task.cancel()
        device = runtime.device(deployed.device_id)
        if device is not None and device.deployment is deployed:
            device.deployment = None
        runtime.deployments.pop(deployed.deployment_id, None)
        runtime.changed.set()
        return max(0, at_start - len(cut)), len(cut)


class SimArtifactJob(
    SimJob[ArtifactClaim | EvictClaim, ProgressReport, CompleteReport, FailReport]
):
    """An acquisition or an eviction, done as if the files were written (or deleted)."""

    cancelled_code = FailureCode.CANCELLED
    internal_code = FailureCode.INTERNAL

    # Whether the files are written (the progress reports count them done).
    done: bool = False

    def progress_report(self) -> ProgressReport:
        spec = self.claim.spec
        files = [
            FileProgress(path=f.path, bytes_done=f.size if self.done else 0) for f in spec.files
        ]
        return ProgressReport(lease=self.fence, files=files)

    def fail_report(self, failure: Failed) -> FailReport:
        return FailReport(lease=self.fence, code=FailureCode(failure.code),
                          retryable=failure.retryable, detail=failure.detail)  # fmt: skip

    async def work(self) -> CompleteReport:
        spec = self.claim.spec
        runtime = self.runtime
        if spec.target_root != runtime.options.artifact_root:
            raise Failed(FailureCode.PATH_NOT_ALLOWED, f"{spec.target_root} is not offered",
                         retryable=False)  # fmt: skip
        base = f"{spec.target_root}/{spec.repository}/{spec.commit}"
        if isinstance(self.claim, EvictClaim):
            for f in spec.files:
                runtime.files.pop(f"{base}/{f.path}", None)
            return EvictReport(kind=JobKind.ARTIFACT_EVICT, lease=self.fence, files=spec.files)
        deadline = time.monotonic() + runtime.options.acquire_s
        while (left := deadline - time.monotonic()) > 0:
            self.check()
            await asyncio.sleep(min(left, 0.5))
        self.check()
        for f in spec.files:
            runtime.files[f"{base}/{f.path}"] = f.size
        self.done = True
        runtime.counters.acquisitions += 1
        return CompleteReport(lease=self.fence, files=list(spec.files))


DEPLOYMENT_EXECUTORS: Final = (
    Executor(JobKind.DEPLOYMENT_LOAD, LoadClaim, SimDeploymentJob),
    Executor(JobKind.DEPLOYMENT_HEALTH, TargetClaim, SimDeploymentJob),
    Executor(JobKind.DEPLOYMENT_DRAIN, TargetClaim, SimDeploymentJob),
    Executor(JobKind.DEPLOYMENT_UNLOAD, TargetClaim, SimDeploymentJob),
)
ARTIFACT_EXECUTORS: Final = (
    Executor(JobKind.ARTIFACT_ACQUIRE, ArtifactClaim, SimArtifactJob),
    Executor(JobKind.ARTIFACT_EVICT, EvictClaim, SimArtifactJob),
)
