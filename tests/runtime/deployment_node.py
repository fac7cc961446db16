"""What the node-side deployment and invoke tests share: a stand-in for the control
plane's INVOKE_STREAM route (it only records what the runtime worker streamed back:
the end-to-end tests run against the real API), a started runtime worker, a recorder of
a job's reports, and the leases and specs a claim would carry."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from agent.client import ProtocolClient, make_http_client
from agent.runtime.admission import sha256_of
from agent.runtime.config import ModelSpec, RuntimeConfig
from agent.runtime.worker import RuntimeWorker
from schemas.deployments import LoadClaim, LoadSpec, TargetClaim, TargetSpec
from schemas.gateway import Invoke, InvokeParams
from schemas.jobs import FailAnswer, JobKind, JobState, Lease, LeaseFence, ProgressAnswer
from schemas.protocol import INVOKE_STATUS_HEADER, INVOKE_STREAM
from schemas.runtime import RuntimeJobFail, RuntimeJobOutcome, RuntimeJobProgress
from stack.ports import free_port

GATEWAY = "ab" * 16


@dataclass
class Streamed:
    """One POST to INVOKE_STREAM as the stand-in received it."""

    headers: dict[str, str]
    chunks: list[bytes] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    broken: bool = False

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)


class StandIn:
    """INVOKE_STREAM only. `answer` is the status it answers once a body ended; while
    `hold` is clear it keeps the request of an answer (not a refusal) open after the
    body (the invoke stays in flight on the node until it answers)."""

    def __init__(self) -> None:
        self.streams: dict[str, list[Streamed]] = {}
        self.answer = 200
        # Answered before the body is read, closing the connection (the API refusing a
        # stream at once: without the close, uvicorn would read on and the node would
        # see the refusal only at the end of its upload).
        self.refuse_at_once: int | None = None
        self.hold = asyncio.Event()
        self.hold.set()
        self.app = Starlette(routes=[Route(INVOKE_STREAM, self._stream, methods=["POST"])])

    async def _stream(self, request: Request) -> Response:
        streamed = Streamed(headers=dict(request.headers))
        self.streams.setdefault(request.path_params["invoke_id"], []).append(streamed)
        if self.refuse_at_once is not None:
            streamed.ended.set()
            return Response(status_code=self.refuse_at_once, headers={"Connection": "close"})
        try:
            async for chunk in request.stream():
                if chunk:
                    streamed.chunks.append(chunk)
                    streamed.arrived.set()
        except ClientDisconnect:
            streamed.broken = True
        streamed.ended.set()
        if request.headers.get(INVOKE_STATUS_HEADER) == "200":
            await self.hold.wait()
        return Response(status_code=self.answer)

    def of(self, invoke_id: uuid.UUID) -> list[Streamed]:
        return self.streams.get(str(invoke_id), [])


@contextlib.asynccontextmanager
async def stand_in() -> AsyncIterator[tuple[StandIn, ProtocolClient]]:
    """The stand-in served on loopback, and a node client pointed at it."""
    recorder = StandIn()
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(recorder.app, host="127.0.0.1", port=port, log_level="warning",
                       lifespan="off")
    )  # fmt: skip
    serving = asyncio.create_task(server.serve())
    await until(lambda: server.started, 10, "the stand-in started")
    try:
        async with make_http_client(f"http://127.0.0.1:{port}", trust_env=False) as http:
            yield recorder, ProtocolClient(http, "node-credential")
    finally:
        recorder.hold.set()
        server.should_exit = True
        await asyncio.wait_for(serving, 15)


@contextlib.asynccontextmanager
async def started_worker(
    run_dir: Path, binary: Path, model: Path, models: list[ModelSpec] | None = None
) -> AsyncIterator[RuntimeWorker]:
    """A runtime worker on `binary` that may load what lies beside `model`, closed after:
    probes every 50 ms and a 1 s unload settle keep the tests short."""
    config = RuntimeConfig(
        llama_server_path=binary,
        run_dir=run_dir,
        artifact_roots=[model.parent],
        llama_server_probe_interval_s=0.05,
        unload_settle_timeout_s=1,
        models=models or [],
    )
    running = RuntimeWorker(config)
    running.start()
    try:
        yield running
    finally:
        await running.close()


async def until(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Poll `check` (every 20 ms) until it is truthy; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := check():
            return value
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


class Reports:
    """A job's reports, recorded; the control plane's answers made up."""

    def __init__(self) -> None:
        self.progress_reports: list[RuntimeJobProgress] = []
        self.completed: list[Any] = []
        self.failed: list[RuntimeJobFail] = []

    async def progress(self, job_id: uuid.UUID, report: RuntimeJobProgress) -> ProgressAnswer:
        self.progress_reports.append(report)
        return ProgressAnswer(job_id=job_id, cancel_requested=False, lease=lease())

    async def complete(self, job_id: uuid.UUID, report: object) -> RuntimeJobOutcome:
        self.completed.append(report)
        return RuntimeJobOutcome(job_id=job_id, state=JobState.SUCCEEDED)

    async def fail(self, job_id: uuid.UUID, report: RuntimeJobFail) -> FailAnswer:
        self.failed.append(report)
        return FailAnswer(job_id=job_id, state=JobState.FAILED)


def lease(epoch: int = 1, renew_within_s: float = 30) -> Lease:
    return Lease(
        lease_id=uuid.uuid4(), epoch=epoch, expires_at=datetime.now(UTC) + timedelta(minutes=5),
        renew_within_s=renew_within_s,
    )  # fmt: skip


def load_claim(
    deployment_id: uuid.UUID, binary: Path, model: Path, *, served: str = "smol-chat",
    device_id: str = "cpu", max_concurrent: int = 2,
) -> LoadClaim:  # fmt: skip
    spec = LoadSpec(
        deployment_id=deployment_id, model=served, device_id=device_id,
        artifact_path=str(model), artifact_digest=digest(model), profile_id=uuid.uuid4(),
        profile_version=1, settings={"ctx_size": 1024, "threads": 2},
        environment_id=uuid.uuid4(), binary_sha256=digest(binary),
        max_concurrent=max_concurrent,
    )  # fmt: skip
    return LoadClaim(job_id=uuid.uuid4(), attempt=1, spec=spec, lease=lease())


def target_claim(
    kind: JobKind, deployment_id: uuid.UUID, deadline_s: float = 0.0, renew_within_s: float = 30
) -> TargetClaim:
    spec = TargetSpec(deployment_id=deployment_id, device_id="cpu", deadline_s=deadline_s)
    return TargetClaim(job_id=uuid.uuid4(), kind=kind, attempt=1, spec=spec,
                       lease=lease(renew_within_s=renew_within_s))  # fmt: skip


_DIGESTS: dict[Path, str] = {}


def digest(path: Path) -> str:
    if path not in _DIGESTS:
        _DIGESTS[path] = sha256_of(path)
    return _DIGESTS[path]


def invoke(deployment_id: uuid.UUID, *, epoch: int = 1, **params: Any) -> Invoke:
    fields: dict[str, Any] = {
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 8,
        **params,
    }
    return Invoke(
        invoke_id=uuid.uuid4(), deployment_id=deployment_id, gateway=GATEWAY,
        lease=LeaseFence(lease_id=uuid.uuid4(), epoch=epoch),
        params=InvokeParams.model_validate(fields),
    )  # fmt: skip
