"""Once the agent settles a job (its fail or complete report) nothing more is reported on
it: a progress report in flight is answered first, and none starts after. One artifact
job runs in this process against the real API and a real Hub-layout server; its reports
go through the real protocol client, watched on the way (nothing is answered for it)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from agent.client import ProtocolClient
from agent.jobs.artifact import ArtifactJob, ArtifactSettings
from agent.jobs.reports import FamilyReports
from schemas.artifacts import ARTIFACT_FAMILY, CompleteReport, ProgressReport
from schemas.base import WireModel
from schemas.jobs import FailAnswer, FailReport, ProgressAnswer
from tests.agent.claimed_jobs import claimed, one_file_job
from tests.api_server import ApiFactory
from tests.artifact_flows import content, get_job
from tests.hub_server import HubServer

REPO = "acme/tiny-model"
COMMIT = "00112233445566778899aabbccddeeff00112233"
DATA = content("model.gguf", 120_000)


class Watched:
    """The protocol client behind a slow link: a progress report takes 0.3 s to arrive,
    and once sent it arrives whatever the sender does next (cancelling the call does
    not call it back). Records when reports are sent and arrive."""

    def __init__(self, client: ProtocolClient) -> None:
        self.client = FamilyReports(client, ARTIFACT_FAMILY)
        self.events: list[str] = []
        self.deliveries: list[asyncio.Future[ProgressAnswer]] = []

    async def progress(self, job_id: uuid.UUID, report: ProgressReport) -> ProgressAnswer:
        self.events.append("progress sent")
        delivery = asyncio.ensure_future(self._deliver(job_id, report))
        self.deliveries.append(delivery)
        return await asyncio.shield(delivery)

    async def _deliver(self, job_id: uuid.UUID, report: ProgressReport) -> ProgressAnswer:
        await asyncio.sleep(0.3)
        self.events.append("progress arrived")
        return await self.client.progress(job_id, report)

    async def complete(self, job_id: uuid.UUID, report: CompleteReport) -> WireModel:
        self.events.append("settled")
        return await self.client.complete(job_id, report)

    async def fail(self, job_id: uuid.UUID, report: FailReport) -> FailAnswer:
        self.events.append("settled")
        return await self.client.fail(job_id, report)


def test_no_progress_report_is_sent_after_the_fail_report(
    api_factory: ApiFactory, hub: HubServer, tmp_path: Path
) -> None:
    hub.state.add(REPO, "main", COMMIT, {"model.gguf": DATA})
    # A second of downloading, then a digest that does not match: a final failure.
    hub.state.corrupt["model.gguf"] = content("something else", len(DATA))
    hub.state.throttle["model.gguf"] = 120_000
    root = tmp_path / "models"
    root.mkdir()
    api = api_factory()
    node, job_id = one_file_job(api, root, REPO, COMMIT, "model.gguf", DATA, max_attempts=1)

    async def run() -> tuple[str, Watched, list[ProgressAnswer | BaseException]]:
        async with claimed(api, node, hub) as (client, claim, source):
            watched = Watched(client)
            settings = ArtifactSettings(roots=[str(root)], progress_interval_s=0.05, stall_s=5)
            job = ArtifactJob(claim, watched, source, settings)
            outcome = await job.run()
            # Whatever was still on the link arrives (and is answered) before we look.
            answers = await asyncio.gather(*watched.deliveries, return_exceptions=True)
            return outcome, watched, answers

    outcome, watched, answers = asyncio.run(run())
    assert outcome == "checksum_mismatch"
    events = watched.events
    assert "progress arrived" in events, events
    # Settled once, last: every progress report arrived before the fail report...
    assert events.index("settled") == len(events) - 1, events
    # ...so the control plane took each one (none met a finished job).
    assert all(isinstance(answer, ProgressAnswer) for answer in answers), answers
    with api.client() as client:
        job = get_job(client, api, job_id)
    assert job["state"] == "failed" and job["failure"]["code"] == "checksum_mismatch"
