"""The agent's job loop: claim the next artifact job, run it, claim again; with nothing
to do, wait for the poll interval (or a wake-up from the notification channel, which
only cuts the latency: polling alone stays correct). Between jobs, when it is due, the
staging no attempt will resume is swept (agent/jobs/sweep.py)."""

from __future__ import annotations

import asyncio
import logging

from agent.client import ProtocolClient
from agent.errors import Rejected, RequestFailed
from agent.jobs.artifact import ArtifactJob, ArtifactSettings
from agent.jobs.sweep import StagingSweep
from agent.jobs.wakeups import wait_for_wake
from agent.sources.hub import HubSource

logger = logging.getLogger("modelforge.agent.jobs")


async def artifact_jobs(
    client: ProtocolClient,
    source: HubSource,
    settings: ArtifactSettings,
    stop: asyncio.Event,
    *,
    poll_s: float,
    wake: asyncio.Event | None = None,
    sweep: StagingSweep | None = None,
) -> None:
    wake = wake or asyncio.Event()
    failing: str | None = None
    while not stop.is_set():
        if sweep is not None:
            await sweep.when_due()
        claim = None
        try:
            claim = await client.claim_artifact_job()
            failing = None
        except RequestFailed as exc:
            kind = type(exc).__name__
            if failing != kind:
                # Once per episode: the publisher reports refusals of the credential.
                logger.warning("claiming artifact jobs failed (%s); polling on", exc)
            failing = kind
            if isinstance(exc, Rejected) and exc.status in (401, 403):
                await wait_for_wake(stop, wake, poll_s * 3)
                continue
        if claim is not None:
            logger.info("claimed artifact job %s (attempt %d)", claim.job_id, claim.attempt)
            await ArtifactJob(claim, client, source, settings).run()
            continue
        await wait_for_wake(stop, wake, poll_s)
