"""runtime.health.v1 and runtime.unload.v1 on one device: the layered health of the
device's server right now (with a one-token inference when it is up), or its unload
after the request in flight, with the time the device took to show the memory freed."""

from __future__ import annotations

from agent.jobs.dispatch import Executor
from agent.runtime.health import server_health
from agent.runtime.jobs import Completion, RuntimeFailed, RuntimeJob, RuntimeReports
from agent.runtime.server import LlamaServer
from agent.runtime.worker import RuntimeWorker
from schemas.jobs import JobKind
from schemas.runtime import (
    DeviceJobClaim,
    HealthComplete,
    RuntimeFailure,
    UnloadComplete,
)


class DeviceJobRun(RuntimeJob):
    def __init__(
        self, claim: DeviceJobClaim, reports: RuntimeReports, worker: RuntimeWorker
    ) -> None:
        super().__init__(claim.job_id, JobKind(claim.kind), claim.lease, reports, worker)
        self.device_id = claim.spec.device_id

    async def work(self) -> Completion:
        slot = self.worker.slot(self.device_id)
        if slot is None:
            raise RuntimeFailed(RuntimeFailure.UNSUPPORTED_BACKEND, f"no device {self.device_id}")
        if self.kind == JobKind.RUNTIME_HEALTH:
            return await self._health(slot.server)
        self.phase = "loading"
        unloaded, settle = await slot.unload(when_turn=self.check)
        return UnloadComplete(
            kind=JobKind.RUNTIME_UNLOAD,
            lease=self.fence,
            device_id=self.device_id,
            unloaded_model=unloaded,
            settle_s=settle,
        )

    async def _health(self, server: LlamaServer | None) -> HealthComplete:
        self.phase = "probing"
        health = await server_health(server)
        loaded = server.model.model_id if server is not None and server.alive else None
        return HealthComplete(
            kind=JobKind.RUNTIME_HEALTH, lease=self.fence, device_id=self.device_id,
            health=health, loaded_model=loaded,
        )  # fmt: skip


# This module's kinds, run by the runtime worker's runtime-jobs loop
# (agent/runtime/control.py).
EXECUTORS = (
    Executor(JobKind.RUNTIME_HEALTH, DeviceJobClaim, DeviceJobRun),
    Executor(JobKind.RUNTIME_UNLOAD, DeviceJobClaim, DeviceJobRun),
)
