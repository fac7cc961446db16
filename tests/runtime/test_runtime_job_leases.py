"""Runtime jobs on a node with two devices, in this process against the real API: the
worker's claim loop (agent/runtime/control.py) runs a job for one device while a job for
the other waits for its device, and a job whose lease is lost stops without doing its
work. The two devices are one host's CPU reported twice (a fake at the hardware edge
only); the device that is held runs a real llama-server with a real model."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.client import ProtocolClient, make_http_client
from agent.jobs.reports import FamilyReports
from agent.runtime.backends import DeviceRef
from agent.runtime.backends.cpu import CpuBackend
from agent.runtime.config import ModelSpec, RuntimeConfig
from agent.runtime.control import ControlPlane
from agent.runtime.device_jobs import DeviceJobRun
from agent.runtime.worker import RuntimeWorker
from schemas.jobs import JobKind
from schemas.protocol import NODES, RUNTIME_JOBS
from schemas.runtime import RUNTIME_FAMILY, DeviceJobClaim, EnvironmentReport
from tests.agent.artifact_agent import ended
from tests.agent.harness import admin, wait_until
from tests.api_server import ApiFactory, RunningApi
from tests.artifact_flows import node_with_roots
from tests.runtime_flows import BINARY_SHA256

# Device ids are `cpu` or `gpu:N` on the wire; the second one is the same CPU again.
HELD, FREE = "gpu:0", "cpu"


class TwoCpus(CpuBackend):
    """The host's CPU as two devices, each with its own slot and server."""

    def devices(self) -> list[DeviceRef]:
        [cpu] = super().devices()
        return [DeviceRef(id=d, backend="cpu", name=d, memory_total_bytes=cpu.memory_total_bytes)
                for d in (HELD, FREE)]  # fmt: skip


@pytest.fixture
def lease_api(api_factory: ApiFactory) -> RunningApi:
    # Progress every second (half of half the lease): a lost lease shows within one.
    return api_factory(job_lease_s=4)


def worker_with_two_devices(tmp_path: Path, binary: Path) -> RuntimeWorker:
    config = RuntimeConfig(
        llama_server_path=binary,
        run_dir=tmp_path / "run",
        job_poll_interval_s=0.2,
        llama_server_probe_interval_s=0.05,
    )
    worker = RuntimeWorker(config, backends=[TwoCpus()])
    worker.start()
    return worker


@contextlib.asynccontextmanager
async def plane_for(api: RunningApi, tmp_path: Path, binary: Path) -> AsyncIterator[ControlPlane]:
    """The worker's control-plane side, its runtime (both devices) reported."""
    with api.client() as operator:
        node = node_with_roots(operator, api)
    worker = worker_with_two_devices(tmp_path, binary)
    environment = EnvironmentReport(binary_sha256=BINARY_SHA256, version="test", backend="cpu")
    try:
        async with make_http_client(api.base_url, trust_env=False) as http:
            client = ProtocolClient(http, node.credential)
            plane = ControlPlane(worker, client, uuid.UUID(node.node_id), environment)
            assert await plane.send_report()
            yield plane
    finally:
        await worker.close()


@contextlib.asynccontextmanager
async def device_held(worker: RuntimeWorker, model: Path) -> AsyncIterator[None]:
    """HELD busy with a request of its own (as a local request would hold it)."""
    spec = ModelSpec(model_id="smol", path=model, threads=1, ctx_size=256)
    slot = worker.slot(HELD)
    assert slot is not None
    async with slot.serving(spec):
        yield


async def unload(api: RunningApi, node_id: str, device: str) -> str:
    body = {"kind": JobKind.RUNTIME_UNLOAD.value, "node_id": node_id, "device_id": device,
            "max_attempts": 1}  # fmt: skip
    async with api.async_client() as client:
        response = await client.post(RUNTIME_JOBS, json=body, headers=api.admin_headers)
    assert response.status_code == 201, response.text
    job_id: str = response.json()["id"]
    return job_id


async def state_of(api: RunningApi, job_id: str) -> str:
    job = await asyncio.to_thread(admin, api, "GET", f"{RUNTIME_JOBS}/{job_id}")
    state: str = job["state"]
    return state


async def test_a_job_for_one_device_does_not_wait_for_a_job_on_another(
    lease_api: RunningApi, tmp_path: Path, llama_server: Path, instruct_model: Path
) -> None:
    api = lease_api
    async with plane_for(api, tmp_path, llama_server) as plane:
        node_id = str(plane.node_id)
        stop = asyncio.Event()
        loop = asyncio.create_task(plane.jobs(stop, asyncio.Event(), plane.runtime_jobs))
        try:
            async with device_held(plane.worker, instruct_model):
                waiting = await unload(api, node_id, HELD)
                await asyncio.to_thread(
                    wait_until,
                    lambda: admin(api, "GET", f"{RUNTIME_JOBS}/{waiting}")["state"] == "leased",
                    15,
                    "the unload of the held device claimed",
                )
                # Claimed after the waiting one: it runs beside it, on its own device.
                beside = await unload(api, node_id, FREE)
                done = await asyncio.to_thread(ended, api, beside, 30, collection=RUNTIME_JOBS)
                assert done["state"] == "succeeded", done
                assert await state_of(api, waiting) == "leased"
            # The held device's turn comes: its unload stops the server it ran.
            done = await asyncio.to_thread(ended, api, waiting, 60, collection=RUNTIME_JOBS)
            assert done["state"] == "succeeded", done
            assert done["result"]["unloaded_model"] == "smol"
            held = plane.worker.slot(HELD)
            assert held is not None and held.loaded_model is None
        finally:
            stop.set()
            await asyncio.wait_for(loop, 30)


async def test_a_lost_lease_stops_a_runtime_job_before_its_work(
    lease_api: RunningApi, tmp_path: Path, llama_server: Path, instruct_model: Path
) -> None:
    """An unload waits for its device; meanwhile the control plane stops taking its
    reports (the node is disabled: 403). Its turn comes: it unloads nothing and reports
    nothing more."""
    api = lease_api
    async with plane_for(api, tmp_path, llama_server) as plane:
        node_id = str(plane.node_id)
        slot = plane.worker.slot(HELD)
        assert slot is not None
        async with device_held(plane.worker, instruct_model):
            job_id = await unload(api, node_id, HELD)
            claim = await plane.client.claim(RUNTIME_FAMILY)
            assert isinstance(claim, DeviceJobClaim) and str(claim.job_id) == job_id
            run = DeviceJobRun(claim, FamilyReports(plane.client, RUNTIME_FAMILY), plane.worker)
            outcome = asyncio.create_task(run.run())
            async with api.async_client() as client:
                disabled = await client.patch(
                    f"{NODES}/{node_id}", json={"enabled": False}, headers=api.admin_headers
                )
            assert disabled.status_code == 200, disabled.text
            await asyncio.wait_for(run.lost.wait(), 10)
        assert await asyncio.wait_for(outcome, 30) == "lease lost"
        assert slot.loaded_model == "smol", "the unload did not run"
        job = await asyncio.to_thread(admin, api, "GET", f"{RUNTIME_JOBS}/{job_id}")
        assert job["state"] == "leased" and job.get("result") is None
