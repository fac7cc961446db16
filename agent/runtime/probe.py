"""One runtime.probe.v1 job on the runtime worker: verify the binary and the artifact
against the digests the lease carries, start (or reuse) the device's server with the
profile's settings, wait for readiness, run the fixed probe input, and report layered
health with measured evidence, or a normalised failure.

The lease is kept alive by progress reports (the phase) while the work runs; their
answer carries an operator's cancel, after which the probe stops and reports
`cancelled`.

What a lease that loads a model must pass first (its settings admitted, its files
verified: `admitted_model`) is shared with deployment.load.v1 (agent/runtime/deployments.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import stat
import time
from pathlib import Path
from typing import Any, Protocol

import httpx
from pydantic import ValidationError

from agent.runtime.config import LoraFile, ModelSpec
from agent.runtime.devices import DeviceSlot
from agent.runtime.jobs import Completion, RuntimeFailed, RuntimeJob, RuntimeReports
from agent.runtime.server import LlamaServer, ServerFailed
from agent.runtime.worker import RuntimeWorker
from schemas.jobs import JobKind
from schemas.runtime import (
    LlamaSettings,
    LlamaTuning,
    ProbeClaim,
    ProbeComplete,
    ProbeEvidence,
    ResolvedLora,
    RuntimeFailure,
    ServerHealth,
    StoredSettings,
    VerifiedFile,
)

logger = logging.getLogger("modelforge.runtime.probe")
# The probe's input is fixed by the protocol; a lease's is cut to this whatever it says.
PROMPT_LIMIT = 4096


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


class LeasedFiles(Protocol):
    """What a lease that loads a model carries (a probe's, a deployment load's): the
    profile's stored settings and the files, each with the digest it must have."""

    @property
    def artifact_path(self) -> str: ...
    @property
    def artifact_digest(self) -> str: ...
    @property
    def settings(self) -> StoredSettings: ...
    @property
    def draft_model(self) -> VerifiedFile | None: ...
    @property
    def loras(self) -> list[ResolvedLora]: ...
    @property
    def binary_sha256(self) -> str: ...


def admitted_settings(spec: LeasedFiles) -> LlamaSettings:
    """The lease's profile under this node's allow-list (schemas/llama_flags.py), checked
    before anything is verified or started: whatever the control plane let through, a
    flag the table does not admit never reaches argv."""
    try:
        settings = LlamaSettings.model_validate(spec.settings)
    except ValidationError as exc:
        reasons = "; ".join(str(error["msg"]) for error in exc.errors())
        raise RuntimeFailed(RuntimeFailure.PROFILE_REFUSED, reasons) from None
    # llama.cpp splits --lora-scaled at commas and colons.
    for lora in spec.loras:
        if any(mark in lora.path for mark in ',:"\n'):
            raise RuntimeFailed(RuntimeFailure.PROFILE_REFUSED, "a LoRA path llama.cpp cannot take")
    return settings


def verify_files(spec: LeasedFiles, binary: Path, roots: list[Path]) -> None:
    """The binary and the files are the ones the lease names, digest for digest, and
    the files lie in the worker's artifact roots (blocking: run it in a thread)."""
    if not binary.is_file():
        raise RuntimeFailed(RuntimeFailure.BINARY_MISSING, f"{binary} does not exist")
    if sha256_of(binary) != spec.binary_sha256:
        raise RuntimeFailed(
            RuntimeFailure.BINARY_DIGEST_MISMATCH, "the binary is not the environment's"
        )
    files = [VerifiedFile(path=spec.artifact_path, sha256=spec.artifact_digest)]
    files += [spec.draft_model] if spec.draft_model else []
    files += spec.loras
    for file in files:
        path = model_file(file.path, roots)
        if sha256_of(path) != file.sha256:
            raise RuntimeFailed(RuntimeFailure.ARTIFACT_DIGEST_MISMATCH, f"{path}: digest differs")


async def admitted_model(
    spec: LeasedFiles, worker: RuntimeWorker, model_id: str, *, alias: str | None = None
) -> ModelSpec:
    """The lease's model, once its settings are admitted and its files verified: what a
    device's server is started with (`alias`: the name it answers under)."""
    settings = admitted_settings(spec)
    config = worker.config
    await asyncio.to_thread(verify_files, spec, config.llama_server_path, config.artifact_roots)
    return ModelSpec(
        model_id=model_id,
        alias=alias,
        path=Path(spec.artifact_path),
        server_args=settings.server_args,
        draft_model=Path(spec.draft_model.path) if spec.draft_model else None,
        loras=[LoraFile(path=Path(lora.path), scale=lora.scale) for lora in spec.loras],
        **settings.model_dump(include=set(LlamaTuning.model_fields)),
    )


def server_failure(exc: ServerFailed) -> RuntimeFailed:
    """A server that could not be made ready, as a runtime job's failure: its own code
    when it is a runtime failure's, else internal (the worker stopping: another attempt
    may well run elsewhere, or after the restart)."""
    known = exc.code in {failure.value for failure in RuntimeFailure}
    return RuntimeFailed(RuntimeFailure(exc.code) if known else RuntimeFailure.INTERNAL, exc.detail)


def model_file(named: str, roots: list[Path]) -> Path:
    """A file the lease names, if it may be loaded: an absolute path without `..`, a
    regular file (not a link, a device or a FIFO), inside one of the worker's
    `artifact_roots` (none: nothing is loaded for the control plane). The control plane
    resolved it from the node's artifact inventory; the node does not take its word for
    where that is."""
    if not roots:
        # Without roots any file the worker can read could be named (and its digest
        # compared): the worker loads nothing for the control plane then.
        raise RuntimeFailed(
            RuntimeFailure.ARTIFACT_MISSING, "the runtime worker has no artifact_roots"
        )
    path = Path(named)
    if not path.is_absolute() or ".." in path.parts:
        raise RuntimeFailed(
            RuntimeFailure.ARTIFACT_MISSING, f"{named} is not an absolute, plain path"
        )
    try:
        mode = path.lstat().st_mode
    except OSError:
        raise RuntimeFailed(RuntimeFailure.ARTIFACT_MISSING, f"{path} does not exist") from None
    if not stat.S_ISREG(mode):
        raise RuntimeFailed(RuntimeFailure.ARTIFACT_MISSING, f"{path} is not a regular file")
    resolved = path.resolve()
    if not any(resolved.is_relative_to(root.resolve()) for root in roots):
        raise RuntimeFailed(
            RuntimeFailure.ARTIFACT_MISSING, f"{path} is outside the artifact roots"
        )
    return path


def peak_rss_bytes(pid: int | None) -> int | None:
    """The process's high-water resident set (Linux VmHWM), while it still runs."""
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class ProbeRun(RuntimeJob):
    """runtime.probe.v1."""

    def __init__(self, claim: ProbeClaim, reports: RuntimeReports, worker: RuntimeWorker) -> None:
        super().__init__(claim.job_id, JobKind.RUNTIME_PROBE, claim.lease, reports, worker)
        self.spec = claim.spec

    async def work(self) -> Completion:
        return await self._probe()

    async def _probe(self) -> ProbeComplete:
        model = await admitted_model(
            self.spec,
            self.worker,
            f"probe-{self.spec.artifact_digest[:12]}-{self.spec.profile_id.hex[:8]}",
        )
        self.check()
        slot = (
            self.worker.slot(self.spec.device_id)
            if self.spec.device_id
            else self.worker.slot_for(model)
        )
        if slot is None:
            raise RuntimeFailed(
                RuntimeFailure.UNSUPPORTED_BACKEND, f"no device {self.spec.device_id}"
            )
        self.phase = "loading"
        settle_before = slot.last_settle_s
        try:
            async with slot.serving(model, bounded=False, when_turn=self.check) as server:
                self.check()
                self.phase = "probing"
                health, timings = await self._infer(server)
                evidence = ProbeEvidence(
                    load_s=server.load_s or 0.0,
                    time_to_first_token_s=timings["ttft_s"],
                    prompt_tokens_per_s=timings.get("prompt_per_second"),
                    generation_tokens_per_s=timings.get("predicted_per_second"),
                    peak_rss_bytes=peak_rss_bytes(server.pid),
                    vram_used_bytes=_vram_used(slot),
                    settle_s=slot.last_settle_s if slot.last_settle_s != settle_before else None,
                )
        except ServerFailed as exc:
            raise server_failure(exc) from None
        return ProbeComplete(
            lease=self.fence, device_id=slot.device.id, health=health, evidence=evidence
        )

    async def _infer(self, server: LlamaServer) -> tuple[ServerHealth, dict[str, float]]:
        layers = await server.health()
        body = {
            "model": server.model.served_name,
            "messages": [{"role": "user", "content": self.spec.prompt[:PROMPT_LIMIT]}],
            # The lease's probe input is fixed; the node bounds it anyway (at least one
            # token, at most the ceiling: -1 would be no bound at all).
            "max_tokens": max(1, min(self.spec.max_tokens, self.worker.config.max_tokens_ceiling)),
            "temperature": 0,
            "stream": True,
        }
        started = time.monotonic()
        first: float | None = None
        text = ""
        timings: dict[str, Any] = {}
        try:
            async with server.http.stream("POST", "/v1/chat/completions", json=body) as r:
                if r.status_code != 200:
                    raise RuntimeFailed(RuntimeFailure.INFERENCE_FAILED, f"HTTP {r.status_code}")
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line.removeprefix("data: "))
                    for choice in chunk.get("choices") or []:
                        piece = (choice.get("delta") or {}).get("content") or ""
                        if piece and first is None:
                            first = time.monotonic() - started
                        text += piece
                    timings = chunk.get("timings") or timings
        except (httpx.HTTPError, ValueError) as exc:
            health = ServerHealth(
                process_up=server.alive,
                health_ok=layers.health_ok,
                model_listed=layers.model_listed,
                inference_ok=False,
            )
            code = (
                RuntimeFailure.INFERENCE_FAILED if server.alive else RuntimeFailure.PROCESS_EXITED
            )
            detail = f"the probe's inference failed ({type(exc).__name__})"
            raise RuntimeFailed(code, detail, health) from None
        health = ServerHealth(
            process_up=server.alive,
            health_ok=layers.health_ok,
            model_listed=layers.model_listed,
            inference_ok=bool(text),
        )
        if not text:
            raise RuntimeFailed(RuntimeFailure.INFERENCE_FAILED, "the probe got no tokens", health)
        measured = {"ttft_s": first if first is not None else time.monotonic() - started}
        for key in ("prompt_per_second", "predicted_per_second"):
            if isinstance(timings.get(key), int | float):
                measured[key] = float(timings[key])
        return health, measured


def _vram_used(slot: DeviceSlot) -> int | None:
    if slot.device.backend != "cuda":
        return None
    metrics = slot.backend.metrics(slot.device)
    if metrics.memory_total_bytes is None or metrics.memory_free_bytes is None:
        return None
    return int(metrics.memory_total_bytes - metrics.memory_free_bytes)
