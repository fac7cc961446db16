"""One runtime.probe.v1 job on the runtime worker: verify the binary and the artifact
against the digests the lease carries, start (or reuse) the device's server with the
profile's settings, wait for readiness, run the fixed probe input, and report layered
health with measured evidence, or a normalised failure.

The lease is kept alive by progress reports (the phase) while the work runs; their
answer carries an operator's cancel, after which the probe stops and reports
`cancelled`.

What a lease that loads a model must pass first (its settings admitted, its files
verified) is agent/runtime/admission.py, shared with deployment.load.v1.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import httpx

from agent.jobs.dispatch import Executor
from agent.runtime.admission import admitted_model, server_failure
from agent.runtime.devices import DeviceSlot
from agent.runtime.jobs import Completion, RuntimeFailed, RuntimeJob, RuntimeReports
from agent.runtime.server import LlamaServer, ServerFailed
from agent.runtime.worker import RuntimeWorker
from schemas.jobs import JobKind
from schemas.runtime import (
    ProbeClaim,
    ProbeComplete,
    ProbeEvidence,
    RuntimeFailure,
    ServerHealth,
)

logger = logging.getLogger("modelforge.runtime.probe")
# The probe's input is fixed by the protocol; a lease's is cut to this whatever it says.
PROMPT_LIMIT = 4096


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
            self.worker.config,
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


# This module's kind, run by the runtime worker's runtime-jobs loop (agent/runtime/control.py).
EXECUTORS = (Executor(JobKind.RUNTIME_PROBE, ProbeClaim, ProbeRun),)
