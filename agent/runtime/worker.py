"""The runtime worker's state: its devices (one slot each), the configured models, the
deployments it serves (agent/runtime/deployed.py), and what it reports about them.
The local API, the job loops and the invokes all work through this."""

from __future__ import annotations

import asyncio
import logging
import uuid

from agent.runtime.backends import RuntimeBackend, backend
from agent.runtime.config import ModelSpec, RuntimeConfig
from agent.runtime.deployed import Deployed
from agent.runtime.devices import DeviceSlot, SlotSettings
from agent.runtime.selection import choose_device
from agent.runtime.server import ServerSettings, reap_leftovers
from schemas.runtime_local import RuntimeDevice, RuntimeInventory, RuntimeRegistration, ServedModel

logger = logging.getLogger("modelforge.runtime")


class RuntimeWorker:
    def __init__(self, config: RuntimeConfig, backends: list[RuntimeBackend] | None = None) -> None:
        self.config = config
        self.backends = backends if backends is not None else [backend(b) for b in config.backends]
        settings = SlotSettings(
            binary=config.llama_server_path,
            run_dir=config.run_dir,
            server=ServerSettings(
                startup_timeout_s=config.llama_server_startup_timeout_s,
                startup_cap_s=config.llama_server_startup_cap_s,
                probe_interval_s=config.llama_server_probe_interval_s,
                stop_grace_s=config.llama_server_stop_grace_s,
            ),
            max_pending=config.max_pending_requests_per_device,
            settle_timeout_s=config.unload_settle_timeout_s,
        )
        # Set whenever a device loads or unloads a model (the runtime report follows).
        self.changed = asyncio.Event()
        # Set when the worker begins to stop: the local API takes no new request.
        self.stopping = asyncio.Event()
        self._closing: asyncio.Future[None] | None = None
        self.slots = [
            DeviceSlot(device, owner, settings, self.changed)
            for owner in self.backends
            for device in owner.devices()
        ]
        if not self.slots:
            raise ValueError("no devices: the configured backends found none")
        # The deployments loaded here, by id (each pins its device's slot).
        self.deployments: dict[uuid.UUID, Deployed] = {}

    def start(self) -> None:
        self.config.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        reaped = reap_leftovers(self.config.run_dir)
        if reaped:
            logger.warning("stopped %d llama-server processes left by an earlier run", reaped)

    def model(self, model_id: str) -> ModelSpec | None:
        return self.config.model(model_id)

    def slot_for(self, model: ModelSpec) -> DeviceSlot:
        """The device for a model of this node's own: never one a deployment pinned to
        its model (when every device is, any: it refuses, agent/runtime/devices.py)."""
        if len(self.slots) == 1:
            return self.slots[0]
        slots = [s for s in self.slots if s.pinned in (None, model.model_id)] or self.slots
        # The common case first, without asking any device for its free memory.
        loaded = [s for s in slots if s.loaded_model == model.model_id]
        if loaded:
            return min(loaded, key=lambda s: s.pending)
        by_id = {slot.device.id: slot for slot in slots}
        chosen = choose_device(model.model_id, [slot.candidate() for slot in slots])
        return by_id[chosen.device_id]

    def slot(self, device_id: str) -> DeviceSlot | None:
        return next((s for s in self.slots if s.device.id == device_id), None)

    def served_models(self) -> list[ServedModel]:
        return [
            ServedModel(model_id=m.served_name, roles=list(m.roles)) for m in self.config.models
        ]

    def inventory(self) -> RuntimeInventory:
        devices = []
        for slot in self.slots:
            metrics = slot.backend.metrics(slot.device)
            devices.append(
                RuntimeDevice(
                    device_id=slot.device.id,
                    backend=slot.device.backend,
                    name=slot.device.name,
                    uuid=slot.device.uuid,
                    memory_total_bytes=metrics.memory_total_bytes,
                    memory_free_bytes=metrics.memory_free_bytes,
                    utilization_percent=metrics.utilization_percent,
                    loaded_model=slot.loaded_model,
                    queue_depth=slot.pending,
                    last_settle_s=slot.last_settle_s,
                )
            )
        loaded = sorted({d.loaded_model for d in devices if d.loaded_model})
        return RuntimeInventory(
            devices=devices,
            served_models=self.served_models(),
            loaded_models=loaded,
            deployments=[deployed.reported() for deployed in self.deployments.values()],
        )

    def registration(self, node_id: str, base_url: str) -> RuntimeRegistration:
        inventory = self.inventory()
        return RuntimeRegistration(
            node_id=node_id,
            base_url=base_url,
            served_models=inventory.served_models,
            devices=inventory.devices,
        )

    async def close(self) -> None:
        """Stop every llama-server. The shutdown grace and the exit both call it: one
        close runs, shielded, and every caller waits for it to end."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close())
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        await asyncio.gather(*(slot.close() for slot in self.slots))
        for owner in self.backends:
            owner.close()
