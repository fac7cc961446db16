"""A deployment pins its device (agent/runtime/deployments.py, devices.py), on an
in-process runtime worker with a real llama-server and a real model: once loaded on
"cpu", the device serves the deployment's model under its served name and switches to
no other (a local API request for another model: 503 device_pinned; a probe on it:
device_pinned, not retried; a second deployment: device_pinned), a reload of the same
deployment starts nothing (but a server that exited), the runtime report lists it, and
its health is layered.
The device selection for local models skips a pinned device (pure)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from agent.runtime.api import create_app
from agent.runtime.backends import DeviceRef
from agent.runtime.backends.cpu import CpuBackend
from agent.runtime.config import ModelSpec, RuntimeConfig
from agent.runtime.deployments import DeploymentJob
from agent.runtime.devices import Pinned
from agent.runtime.probe import ProbeRun
from agent.runtime.worker import RuntimeWorker
from schemas.deployments import HealthComplete, LoadComplete
from schemas.jobs import JobKind
from schemas.runtime import ProbeClaim, ProbeSpec, RuntimeFailure, ServerHealth
from tests.runtime.deployment_node import (
    Reports,
    digest,
    lease,
    load_claim,
    started_worker,
    target_claim,
)
from tests.runtime.harness import chat

HEALTHY = ServerHealth(process_up=True, health_ok=True, model_listed=True, inference_ok=True)


@pytest.fixture
async def worker(
    tmp_path: Path, llama_server: Path, instruct_model: Path
) -> AsyncIterator[RuntimeWorker]:
    models = [ModelSpec(model_id="smol", path=instruct_model, threads=1, ctx_size=256)]
    async with started_worker(tmp_path / "run", llama_server, instruct_model, models) as running:
        yield running


async def test_a_loaded_deployment_pins_its_device(
    worker: RuntimeWorker, llama_server: Path, instruct_model: Path
) -> None:
    deployment_id = uuid.uuid4()
    reports = Reports()
    claim = load_claim(deployment_id, llama_server, instruct_model, served="smol-chat")
    assert await DeploymentJob(claim, reports, worker).run() == "completed"
    [loaded] = reports.completed
    assert isinstance(loaded, LoadComplete)
    assert loaded.device_id == "cpu" and loaded.health == HEALTHY and loaded.load_s > 0
    slot = worker.slots[0]
    assert slot.pinned == f"deploy-{deployment_id.hex[:12]}" == slot.loaded_model
    server = slot.server
    assert server is not None
    # llama-server answers under the served name.
    models = (await server.http.get("/v1/models")).json()
    assert [m["id"] for m in models["data"]] == ["smol-chat"]
    [reported] = worker.inventory().deployments
    assert (reported.deployment_id, reported.state, reported.in_flight) == (
        deployment_id,
        "ready",
        0,
    )

    # A local request for the node's own model: refused, the deployment's server kept.
    app = create_app(worker, node_id="node", base_url="http://runtime")
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://runtime"
    ) as local:
        refused = await local.post("/v1/chat/completions", json=chat("smol", max_tokens=2))
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "device_pinned"
    assert "Retry-After" in refused.headers
    with pytest.raises(Pinned):
        async with slot.serving(worker.config.models[0], bounded=False):
            pass

    # A probe on the device: device_pinned, not retried (it loads nothing).
    probe = ProbeClaim(
        job_id=uuid.uuid4(), attempt=1, lease=lease(),
        spec=ProbeSpec(
            artifact_path=str(instruct_model), artifact_digest=digest(instruct_model),
            profile_id=uuid.uuid4(), profile_version=1, settings={"ctx_size": 256},
            environment_id=uuid.uuid4(), binary_sha256=digest(llama_server), device_id="cpu",
        ),
    )  # fmt: skip
    probed = Reports()
    assert await ProbeRun(probe, probed, worker).run() == RuntimeFailure.DEVICE_PINNED
    [failed] = probed.failed
    assert failed.code == RuntimeFailure.DEVICE_PINNED and not failed.retryable

    # Another deployment on the same device: the same, before anything is verified.
    other = Reports()
    another = load_claim(uuid.uuid4(), llama_server, instruct_model, served="other")
    assert await DeploymentJob(another, other, worker).run() == RuntimeFailure.DEVICE_PINNED
    assert not other.failed[0].retryable

    # The same deployment again: a success that starts nothing.
    again = Reports()
    assert await DeploymentJob(claim, again, worker).run() == "completed"
    assert slot.server is server and server.alive
    assert again.completed[0].health == HEALTHY

    health = Reports()
    checked = target_claim(JobKind.DEPLOYMENT_HEALTH, deployment_id)
    assert await DeploymentJob(checked, health, worker).run() == "completed"
    [healthy] = health.completed
    assert healthy == HealthComplete(
        kind=JobKind.DEPLOYMENT_HEALTH, lease=healthy.lease, health=HEALTHY, in_flight=0
    )
    absent = Reports()
    unknown = target_claim(JobKind.DEPLOYMENT_HEALTH, uuid.uuid4())
    assert await DeploymentJob(unknown, absent, worker).run() == "completed"
    assert not any(absent.completed[0].health.model_dump().values())

    # Its server exited: the health says so, and a reload starts it again, pinned.
    await server.stop()
    down = Reports()
    assert await DeploymentJob(checked, down, worker).run() == "completed"
    assert not down.completed[0].health.process_up
    restarted = Reports()
    assert await DeploymentJob(claim, restarted, worker).run() == "completed"
    assert restarted.completed[0].health == HEALTHY
    assert slot.server is not server and slot.pinned == slot.loaded_model


class TwoCpus(CpuBackend):
    def devices(self) -> list[DeviceRef]:
        [cpu] = super().devices()
        return [DeviceRef(id=d, backend="cpu", name=d, memory_total_bytes=cpu.memory_total_bytes)
                for d in ("gpu:0", "cpu")]  # fmt: skip


@pytest.mark.fast
def test_a_pinned_device_is_never_chosen_for_a_local_model(tmp_path: Path) -> None:
    config = RuntimeConfig(llama_server_path=tmp_path / "llama-server", run_dir=tmp_path / "run")
    worker = RuntimeWorker(config, backends=[TwoCpus()])
    local = ModelSpec(model_id="smol", path=tmp_path / "m.gguf")
    pinned, free = worker.slots
    pinned.pin("deploy-000000000001")
    assert all(worker.slot_for(local) is free for _ in range(5))
    free.pin("deploy-000000000002")
    # Every device pinned: any, and it refuses.
    with pytest.raises(Pinned):
        worker.slot_for(local).refuse_other(local.model_id)
