"""One slot per device: at most one llama-server on it, requests served one at a time in
arrival order, a bound on how many may wait, and model switching by restart.

`serving(model)` is the whole contract: it refuses at once when the device is full
(`Busy`, answered 429), otherwise waits its turn, makes sure the device runs that model
(`ensure_server`: reuse, or stop the other model's server, let the memory settle, start
and wait for readiness), and holds the device for the caller's request. Because the
device is held for the whole request, a switch waits for the request in flight.

A device that serves a deployment is **pinned** to its model (`pin`, under the turn):
until the deployment's unload (`unload(pinned_to=...)`) it switches to no other model,
and whoever asks for one gets `Pinned` at once (the local API: 503 `device_pinned`; any
job: the failure `device_pinned`, not retried).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from agent.jobs.lease import Failed
from agent.runtime.backends import DeviceRef, RuntimeBackend
from agent.runtime.config import ModelSpec
from agent.runtime.selection import Candidate
from agent.runtime.server import LlamaServer, ServerFailed, ServerSettings
from schemas.runtime import RuntimeFailure

logger = logging.getLogger("modelforge.runtime.devices")


class Busy(Exception):
    """The device's bound of in-flight plus queued requests is reached."""


class Pinned(Failed):
    """The device serves a deployment's model and switches to no other. A job's failure
    as it is (`device_pinned`, not retryable: the lease runner reports it for any kind
    that meets it); the local API answers it 503."""

    def __init__(self, device_id: str, pinned_to: str) -> None:
        detail = f"{device_id} serves a deployment ({pinned_to}) and loads no other model"
        super().__init__(RuntimeFailure.DEVICE_PINNED, detail, retryable=False)


@dataclass(frozen=True)
class SlotSettings:
    binary: Path
    run_dir: Path
    server: ServerSettings
    max_pending: int
    settle_timeout_s: float


class DeviceSlot:
    def __init__(
        self,
        device: DeviceRef,
        backend: RuntimeBackend,
        settings: SlotSettings,
        changed: asyncio.Event | None = None,
    ) -> None:
        self.device = device
        self.changed = changed or asyncio.Event()
        self.backend = backend
        self.settings = settings
        self.server: LlamaServer | None = None
        self.pending = 0
        self.last_settle_s: float | None = None
        self.closed = False
        # The model_id of the deployment this device serves, if any (see Pinned).
        self.pinned: str | None = None
        # asyncio.Lock wakes its waiters in order: requests are served as they came.
        self._turn = asyncio.Lock()

    @property
    def loaded_model(self) -> str | None:
        server = self.server
        return server.model.model_id if server is not None and server.alive else None

    def refuse_other(self, model_id: str | None) -> None:
        """Raise Pinned unless the device may serve `model_id` (None: no model at all)."""
        if self.pinned is not None and model_id != self.pinned:
            raise Pinned(self.device.id, self.pinned)

    def pin(self, model_id: str) -> None:
        """Keep the device on `model_id` (a deployment's) until its unload. Call only
        while holding the device's turn, with that model's server running."""
        self.refuse_other(model_id)
        self.pinned = model_id

    def candidate(self) -> Candidate:
        free = self.backend.metrics(self.device).memory_free_bytes
        return Candidate(self.device.id, self.loaded_model, self.pending, free)

    @asynccontextmanager
    async def serving(
        self,
        model: ModelSpec,
        *,
        bounded: bool = True,
        when_turn: Callable[[], None] | None = None,
    ) -> AsyncIterator[LlamaServer]:
        """The device's server for `model`, held for the caller's request. bounded=False
        (runtime jobs, which the control plane already paces) waits in line regardless;
        `when_turn` runs once the turn has come, before any load (it may raise: a job
        cancelled while it waited loads nothing)."""
        self.refuse_other(model.model_id)  # at once: waiting would not help
        if bounded and self.pending >= self.settings.max_pending:
            raise Busy(f"{self.device.id}: {self.pending} requests in flight or queued")
        self.pending += 1
        try:
            async with self._turn:
                if when_turn is not None:
                    when_turn()
                if self.closed:
                    # The worker stopped while this one waited: start nothing again.
                    raise ServerFailed("stopping", f"{self.device.id}: the worker is stopping")
                yield await self.ensure_server(model)
        finally:
            self.pending -= 1

    async def ensure_server(self, model: ModelSpec) -> LlamaServer:
        """The device's server for this model, started (or restarted) if need be.
        Call only while holding the device's turn."""
        self.refuse_other(model.model_id)
        server = self.server
        if server is not None and server.model.model_id == model.model_id and server.alive:
            return server
        if server is not None:
            await self._unload(server, reason="switch" if server.alive else "exited")
        fresh = LlamaServer(
            self.settings.binary,
            model,
            self.device,
            self.backend.environment(self.device),
            self.settings.run_dir,
            self.settings.server,
        )
        try:
            await fresh.start()
        except BaseException:
            await fresh.close()
            raise
        if self.closed:
            # The worker stopped while this one loaded: it must not outlive the close.
            await fresh.close()
            raise ServerFailed("stopping", f"{self.device.id}: the worker is stopping")
        self.server = fresh
        self.changed.set()
        return fresh

    async def unload(
        self, *, when_turn: Callable[[], None] | None = None, pinned_to: str | None = None
    ) -> tuple[str | None, float | None]:
        """Stop the device's server (after the request in flight): the model it served
        and the settle time, or (None, None) when none ran. `when_turn` as in serving.
        A pinned device is unloaded only by its deployment (`pinned_to`, its model_id),
        which unpins it."""
        async with self._turn:
            if when_turn is not None:
                when_turn()
            if self.pinned is not None:
                self.refuse_other(pinned_to)
            self.pinned = None
            server = self.server
            if server is None:
                return None, None
            return server.model.model_id, await self._unload(server, reason="unload")

    async def _unload(self, server: LlamaServer, *, reason: str) -> float:
        self.server = None
        self.changed.set()
        before = self.backend.metrics(self.device).memory_free_bytes
        await server.close()
        settle = await self._settle(before)
        logger.info(
            "%s: %s unloaded (%s); memory settled in %.2f s",
            self.device.id,
            server.model.model_id,
            reason,
            settle,
        )
        return settle

    async def _settle(self, free_before: int | None) -> float:
        """Wait (bounded) until the device shows the server's memory freed: free memory
        stops rising. A GPU frees it asynchronously after the process is gone."""
        started = time.monotonic()
        deadline = started + self.settings.settle_timeout_s
        previous = free_before
        while time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            free = self.backend.metrics(self.device).memory_free_bytes
            if free is None or (previous is not None and free <= previous):
                break
            previous = free
        self.last_settle_s = time.monotonic() - started
        return self.last_settle_s

    async def close(self) -> None:
        self.closed = True
        server, self.server = self.server, None
        if server is not None:
            await server.close()
