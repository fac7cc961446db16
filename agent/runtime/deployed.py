"""What the runtime worker keeps of each deployment it serves (`Deployed`, in
`RuntimeWorker.deployments` by id): its pinned device, its bound and the invokes running
on it. The deployment jobs (agent/runtime/deployments.py) add and remove them; invokes
(agent/runtime/invoke.py) admit themselves against them; the worker reports them."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field

from agent.runtime.config import ModelSpec
from agent.runtime.devices import DeviceSlot
from agent.runtime.server import LlamaServer
from schemas.deployments import ReportedDeployment


@dataclass
class Deployed:
    """A deployment this worker serves: its model (on its device's pinned slot), its
    bound, and the invokes running on it, by invoke id."""

    deployment_id: uuid.UUID
    model: ModelSpec
    slot: DeviceSlot
    max_concurrent: int
    draining: bool = False
    invokes: dict[uuid.UUID, asyncio.Task[object]] = field(default_factory=dict)
    # Set whenever an invoke ends (a drain waits on it).
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def in_flight(self) -> int:
        return len(self.invokes)

    @property
    def server(self) -> LlamaServer | None:
        """Its llama-server, if it runs (the device's, as long as it is this model's)."""
        server = self.slot.server
        if server is None or server.model.model_id != self.model.model_id or not server.alive:
            return None
        return server

    def reported(self) -> ReportedDeployment:
        return ReportedDeployment(
            deployment_id=self.deployment_id,
            device_id=self.slot.device.id,
            model=self.model.served_name,
            state="draining" if self.draining else "ready",
            in_flight=self.in_flight,
        )


def deployment_model_id(deployment_id: uuid.UUID) -> str:
    return f"deploy-{deployment_id.hex[:12]}"
