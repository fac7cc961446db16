"""Deployments on the runtime worker: the deployment kinds' jobs, over what the worker
keeps of each deployment it serves (agent/runtime/deployed.py: `Deployed`).

Every kind runs under its lease on the one lease runner (agent/runtime/jobs.py
RuntimeJob over agent/jobs/lease.py), claimed by the deployment-jobs claim loop
(agent/runtime/control.py):

* **deployment.load.v1**: the lease's settings admitted and its files verified exactly
  as a probe's (agent/runtime/admission.py); the model, named
  `deploy-<id hex[:12]>` and answering under the served name (its alias), started on
  the lease's device through the device's turn; then the device is **pinned** to it
  (agent/runtime/devices.py: no other model runs there until its unload). A device
  pinned by another deployment fails `device_pinned` (not retried). The same
  deployment already loaded here is a success that starts nothing (but its server,
  if that exited since).
* **deployment.health.v1**: the layered health of its server, with a one-token
  inference, and its invokes in flight; every layer False when it is not loaded here.
* **deployment.drain.v1** and **deployment.unload.v1**: new invokes refused at once
  (`deployment_draining`); those in flight get `deadline_s` to finish (the drain
  reports its phase meanwhile, and stops waiting on a cancel or a lost lease); then
  the server is unloaded through the device's turn, which cuts the invokes still
  running (their llama-server connections closed: each stream ends with the error
  event), the device is unpinned and the deployment forgotten. An unload of a
  deployment not loaded here says so (`unloaded: false`).

Invokes (agent/runtime/invoke.py) read `Deployed` to admit themselves and register
their task in it, so a drain can count and cut them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from agent.jobs.dispatch import Executor
from agent.jobs.lease import Reports
from agent.runtime.admission import admitted_model, server_failure
from agent.runtime.deployed import Deployed, deployment_model_id
from agent.runtime.health import NOTHING, server_health
from agent.runtime.jobs import RuntimeFailed, RuntimeJob
from agent.runtime.server import ServerFailed
from agent.runtime.worker import RuntimeWorker
from schemas.deployments import (
    DrainComplete,
    HealthComplete,
    LoadClaim,
    LoadComplete,
    TargetClaim,
    UnloadComplete,
)
from schemas.jobs import JobKind
from schemas.runtime import RuntimeFailure, RuntimeJobFail, RuntimeJobProgress

logger = logging.getLogger("modelforge.runtime.deployments")

# How long cut invokes get to report their end (their llama-server connections are
# closed at once); then their tasks are cancelled.
CUT_WAIT_S = 5.0

# What a deployment job completes with: its kind's report.
DeploymentCompletion = LoadComplete | HealthComplete | DrainComplete | UnloadComplete


class DeploymentJob(RuntimeJob[DeploymentCompletion]):
    """Any deployment kind, by its claim."""

    def __init__(
        self,
        claim: LoadClaim | TargetClaim,
        reports: Reports[RuntimeJobProgress, DeploymentCompletion, RuntimeJobFail],
        worker: RuntimeWorker,
    ) -> None:
        super().__init__(claim.job_id, JobKind(claim.kind), claim.lease, reports, worker)
        self.claim = claim

    async def work(self) -> DeploymentCompletion:
        claim = self.claim
        if isinstance(claim, LoadClaim):
            return await self._load(claim)
        deployed = self.worker.deployments.get(claim.spec.deployment_id)
        if claim.kind == JobKind.DEPLOYMENT_HEALTH:
            self.phase = "probing"
            if deployed is None:
                return HealthComplete(
                    kind=JobKind.DEPLOYMENT_HEALTH, lease=self.fence, health=NOTHING, in_flight=0
                )
            health = await server_health(deployed.server)
            return HealthComplete(
                kind=JobKind.DEPLOYMENT_HEALTH,
                lease=self.fence,
                health=health,
                in_flight=deployed.in_flight,
            )
        if deployed is None:
            if claim.kind == JobKind.DEPLOYMENT_DRAIN:
                return DrainComplete(
                    kind=JobKind.DEPLOYMENT_DRAIN, lease=self.fence, finished=0, cut=0
                )
            return UnloadComplete(kind=JobKind.DEPLOYMENT_UNLOAD, lease=self.fence, unloaded=False)
        finished, cut, settle = await self._drain(deployed, claim.spec.deadline_s)
        if claim.kind == JobKind.DEPLOYMENT_DRAIN:
            return DrainComplete(
                kind=JobKind.DEPLOYMENT_DRAIN,
                lease=self.fence,
                finished=finished,
                cut=cut,
                settle_s=settle,
            )
        return UnloadComplete(
            kind=JobKind.DEPLOYMENT_UNLOAD,
            lease=self.fence,
            unloaded=True,
            cut=cut,
            settle_s=settle,
        )

    async def _load(self, claim: LoadClaim) -> LoadComplete:
        spec = claim.spec
        loaded = self.worker.deployments.get(spec.deployment_id)
        if loaded is not None:
            if loaded.server is None:
                # Its server exited since: started again on its pinned device.
                await self._restart(loaded)
            return await self._loaded(loaded)
        slot = self.worker.slot(spec.device_id)
        if slot is None:
            raise RuntimeFailed(RuntimeFailure.UNSUPPORTED_BACKEND, f"no device {spec.device_id}")
        # Refused before anything is verified: the device serves another deployment.
        model_id = deployment_model_id(spec.deployment_id)
        slot.refuse_other(model_id)
        model = await admitted_model(
            spec, self.worker.config, model_id, alias=spec.model, endpoints=spec.endpoints
        )
        self.check()
        self.phase = "loading"
        try:
            async with slot.serving(model, bounded=False, when_turn=self.check):
                loaded = self.worker.deployments.get(spec.deployment_id)
                if loaded is None:
                    # A lease lost (or a cancel) during the load pins nothing: the next
                    # attempt finds the server running and takes it over.
                    self.check()
                    slot.pin(model.model_id)
                    loaded = Deployed(spec.deployment_id, model, slot, spec.max_concurrent)
                    self.worker.deployments[spec.deployment_id] = loaded
                    self.worker.changed.set()
                    logger.info(
                        "deployment %s (%s) loaded on %s",
                        spec.deployment_id,
                        spec.model,
                        slot.device.id,
                    )
        except ServerFailed as exc:
            raise server_failure(exc) from None
        return await self._loaded(loaded)

    async def _restart(self, deployed: Deployed) -> None:
        self.phase = "loading"
        try:
            async with deployed.slot.serving(deployed.model, bounded=False, when_turn=self.check):
                pass
        except ServerFailed as exc:
            raise server_failure(exc) from None

    async def _loaded(self, deployed: Deployed) -> LoadComplete:
        server = deployed.server
        return LoadComplete(
            lease=self.fence,
            device_id=deployed.slot.device.id,
            health=await server_health(server),
            load_s=min(server.load_s or 0.0, 86_400) if server is not None else 0.0,
            capabilities=await server.template_caps() if server is not None else None,
        )

    async def _drain(self, deployed: Deployed, deadline_s: float) -> tuple[int, int, float | None]:
        """No new invokes; those in flight finish within the deadline or are cut; then
        the unload. (finished, cut, settle_s)."""
        if not deployed.draining:
            deployed.draining = True
            self.worker.changed.set()
        self.phase = "draining"
        at_start = deployed.in_flight
        deadline = time.monotonic() + deadline_s
        while deployed.invokes and (left := deadline - time.monotonic()) > 0:
            self.check()
            deployed.ended.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(deployed.ended.wait(), min(left, 0.5))
        self.check()
        cut = list(deployed.invokes.values())
        self.phase = "unloading"
        slot = deployed.slot
        # The unload closes the connections of the invokes still running: each stream
        # ends with the error event (a non-streamed one is refused upstream_unavailable).
        _, settle = await slot.unload(when_turn=self.check, pinned_to=deployed.model.model_id)
        self.worker.deployments.pop(deployed.deployment_id, None)
        self.worker.changed.set()
        if cut:
            logger.info("deployment %s: %d invokes cut", deployed.deployment_id, len(cut))
            _, late = await asyncio.wait(cut, timeout=CUT_WAIT_S)
            for task in late:
                task.cancel()
        logger.info("deployment %s unloaded from %s", deployed.deployment_id, slot.device.id)
        return max(0, at_start - len(cut)), len(cut), settle


# This module's kinds, run by the runtime worker's deployment-jobs loop
# (agent/runtime/control.py).
EXECUTORS = (
    Executor(JobKind.DEPLOYMENT_LOAD, LoadClaim, DeploymentJob),
    Executor(JobKind.DEPLOYMENT_HEALTH, TargetClaim, DeploymentJob),
    Executor(JobKind.DEPLOYMENT_DRAIN, TargetClaim, DeploymentJob),
    Executor(JobKind.DEPLOYMENT_UNLOAD, TargetClaim, DeploymentJob),
)
