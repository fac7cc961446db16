"""The one claim loop and the one lease runner (agent/jobs/loop.py, lease.py), in this
process against the real API: a refused node's loops, artifact and runtime alike, back
off instead of claiming every poll; an artifact job whose lease is lost stops its
download at once and keeps its partial file for the next attempt."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from agent.client import ProtocolClient, make_http_client
from agent.jobs.artifact import ArtifactJob, ArtifactSettings
from agent.jobs.dispatch import FamilyJobs, NotServed
from agent.jobs.loop import REFUSED_BACKOFF, Job, claim_loop
from agent.jobs.paths import staging_dir
from agent.jobs.reports import FamilyReports
from schemas.artifacts import ARTIFACT_FAMILY, CompleteReport
from schemas.protocol import NODES
from schemas.runtime import RUNTIME_FAMILY
from tests.agent.claimed_jobs import claimed, one_file_job
from tests.api_server import ApiFactory, RunningApi
from tests.artifact_flows import content, get_job, node_with_roots
from tests.hub_server import HubServer

POLL_S = 0.1
REPO = "acme/slow-model"
COMMIT = "aabbccddeeff00112233445566778899aabbccdd"
DATA = content("model.gguf", 2_000_000)


async def disable(api: RunningApi, node_id: str) -> None:
    async with api.async_client() as client:
        response = await client.patch(
            f"{NODES}/{node_id}", json={"enabled": False}, headers=api.admin_headers
        )
    assert response.status_code == 200, response.text


class Counted:
    """A kind's claim call, counted on its way to the API."""

    def __init__(self, claim: Callable[[], Awaitable[object]]) -> None:
        self.claim = claim
        self.calls = 0

    async def __call__(self) -> Job | None:
        self.calls += 1
        claimed = await self.claim()
        assert claimed is None, "the test created no job"
        return None


async def test_both_kinds_back_off_while_the_node_is_refused(
    api_factory: ApiFactory, caplog: pytest.LogCaptureFixture
) -> None:
    api = api_factory()
    with api.client() as operator:
        node = node_with_roots(operator, api)
    await disable(api, node.node_id)
    caplog.set_level(logging.WARNING, logger="modelforge.agent.jobs")
    async with make_http_client(api.base_url, trust_env=False) as http:
        client = ProtocolClient(http, node.credential)
        artifact = Counted(lambda: client.claim(ARTIFACT_FAMILY))
        runtime = Counted(lambda: client.claim(RUNTIME_FAMILY))
        stop = asyncio.Event()
        loops = [
            asyncio.create_task(claim_loop("artifact jobs", artifact, stop, poll_s=POLL_S)),
            asyncio.create_task(claim_loop("runtime jobs", runtime, stop, poll_s=POLL_S)),
        ]
        # A window for what must not happen: a claim every poll (15 in it) while refused.
        window_s = 1.5
        await asyncio.sleep(window_s)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*loops), 5)
    most = window_s / (POLL_S * REFUSED_BACKOFF) + 1
    for counted in (artifact, runtime):
        assert 1 <= counted.calls <= most, (counted.calls, most)
    # Each loop says so once, not at every claim.
    refusals = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert sorted(m.split(" failed")[0] for m in refusals) == [
        "claiming artifact jobs",
        "claiming runtime jobs",
    ], refusals


async def test_a_lost_lease_stops_an_artifact_download_and_keeps_its_part(
    api_factory: ApiFactory, hub: HubServer, tmp_path: Path
) -> None:
    hub.state.add(REPO, "main", COMMIT, {"model.gguf": DATA})
    hub.state.throttle["model.gguf"] = 100_000  # 20 s for the whole file
    root = tmp_path / "models"
    root.mkdir()
    api = api_factory(job_lease_s=4)
    node, job_id = one_file_job(api, root, REPO, COMMIT, "model.gguf", DATA)
    async with claimed(api, node, hub) as (client, claim, source):
        settings = ArtifactSettings(roots=[str(root)], progress_interval_s=0.2, stall_s=10)
        job = ArtifactJob(claim, FamilyReports(client, ARTIFACT_FAMILY), source, settings)
        outcome = asyncio.create_task(job.run())

        staged = staging_dir(root, claim.job_id) / "model.gguf"

        async def under_way() -> None:
            """Until some bytes are on disk (a block is written every 0.25 s)."""
            while not outcome.done() and (not staged.exists() or staged.stat().st_size == 0):
                await asyncio.sleep(0.05)

        await asyncio.wait_for(under_way(), 10)
        assert not outcome.done(), outcome.result()
        await disable(api, node.node_id)
        assert await asyncio.wait_for(outcome, 5) == "lease lost"
    assert job.progress.bytes_done < len(DATA)
    assert 0 < staged.stat().st_size < len(DATA), "the part is kept for the next attempt"
    with api.client() as operator:
        assert get_job(operator, api, job_id)["state"] == "leased"


class Broken(ArtifactJob):
    """An artifact job whose work fails in a way it did not foresee."""

    async def work(self) -> CompleteReport:
        raise RuntimeError("a bug")


async def test_an_unforeseen_failure_settles_the_job_as_internal(
    api_factory: ApiFactory, hub: HubServer, tmp_path: Path
) -> None:
    """Not left to wait out its lease: reported as `internal` at once, and retried."""
    root = tmp_path / "models"
    root.mkdir()
    api = api_factory(job_lease_s=60)
    node, job_id = one_file_job(api, root, REPO, COMMIT, "model.gguf", DATA)
    async with claimed(api, node, hub) as (client, claim, source):
        settings = ArtifactSettings(roots=[str(root)], progress_interval_s=0.2, stall_s=10)
        job = Broken(claim, FamilyReports(client, ARTIFACT_FAMILY), source, settings)
        assert await asyncio.wait_for(job.run(), 10) == "internal"
    with api.client() as operator:
        settled = get_job(operator, api, job_id)
    assert settled["state"] == "queued" and settled["attempt"] == 1, settled
    assert settled["failure"]["code"] == "internal" and settled["failure"]["retryable"]


async def test_a_claim_no_executor_here_runs_is_not_started(
    api_factory: ApiFactory, tmp_path: Path
) -> None:
    """A kind of a served family this process has no executor for (a declaration ahead
    of its node side) raises to the claim loop, which logs it and backs off; the lease
    runs out and the job goes to a later attempt (tests/agent/test_executors.py keeps
    every declared kind run)."""
    root = tmp_path / "models"
    root.mkdir()
    api = api_factory()
    node, job_id = one_file_job(api, root, REPO, COMMIT, "model.gguf", DATA)
    async with make_http_client(api.base_url, trust_env=False) as http:
        served = FamilyJobs[None](ProtocolClient(http, node.credential), ARTIFACT_FAMILY, (), None)
        with pytest.raises(NotServed, match=r"artifact\.acquire\.v1"):
            await served.next_job()
    with api.client() as operator:
        assert get_job(operator, api, job_id)["state"] == "leased"
