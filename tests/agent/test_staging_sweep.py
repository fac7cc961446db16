"""The staging sweep (agent/jobs/sweep.py) against the real API: the refusal of a report
under a lease no one holds tells a live job from one nothing will resume, so only the
staging of ended or unknown jobs is removed; another node's (two nodes may share a root)
and, with no answer, any other is removed only when old.
The end-to-end case (the agent stopped across a cancel) is in test_artifact_jobs_agent.py.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

import pytest

from agent.client import ProtocolClient, make_http_client
from agent.jobs.paths import STAGING_DIR
from agent.jobs.reports import FamilyReports
from agent.jobs.sweep import StagingSweep, Verdict, verdict
from schemas.artifacts import ARTIFACT_FAMILY
from tests.api_server import ApiFactory, RunningApi, free_port
from tests.artifact_flows import claimed, complete, created, fence, get_job, node_with_roots


def _verdicts(api: RunningApi, credential: str, job_ids: list[str]) -> list[Verdict]:
    async def ask() -> list[Verdict]:
        async with make_http_client(api.base_url, trust_env=False) as http:
            client = ProtocolClient(http, credential)
            reports = FamilyReports(client, ARTIFACT_FAMILY)
            return [await verdict(reports, uuid.UUID(job_id)) for job_id in job_ids]

    return asyncio.run(ask())


def test_the_control_plane_tells_live_jobs_from_ended_ones(api_factory: ApiFactory) -> None:
    api = api_factory()
    with api.client() as client:
        node = node_with_roots(client, api)
        other = node_with_roots(client, api, hostname="gpu-host-2")
        leased = created(client, api, node)
        assert claimed(client, node)["job_id"] == leased
        done = created(client, api, node)
        finishing = claimed(client, node)
        assert complete(client, node, done, fence(finishing)).json()["state"] == "succeeded"
        queued = created(client, api, node)
        foreign = created(client, api, other)
        before = get_job(client, api, leased)
    said = _verdicts(api, node.credential, [leased, queued, done, foreign, str(uuid.uuid4())])
    assert said == [Verdict.LIVE, Verdict.LIVE, Verdict.ENDED, Verdict.UNKNOWN, Verdict.ENDED]
    with api.client() as client:
        after = get_job(client, api, leased)
    # Asking changed nothing: the lease was not extended, no progress was recorded.
    assert after["lease"] == before["lease"] and after["state"] == "leased"
    assert after["progress"] == before["progress"]


def _staging(root: Path, name: str, age_s: float = 0) -> Path:
    path = root / STAGING_DIR / name
    (path / "weights").mkdir(parents=True)
    part = path / "weights" / "model.gguf"
    part.write_bytes(b"partial")
    then = time.time() - age_s
    for item in (part, part.parent, path):
        os.utime(item, (then, then))
    return path


@pytest.mark.fast
def test_with_no_answer_only_old_staging_goes(tmp_path: Path) -> None:
    root = tmp_path / "models"
    old = _staging(root, str(uuid.uuid4()), age_s=3600)
    fresh = _staging(root, str(uuid.uuid4()), age_s=10)
    not_ours = _staging(root, "not-a-job-id", age_s=3600)

    async def sweep() -> list[uuid.UUID]:
        # Nothing listens there: every question goes unanswered.
        async with make_http_client(f"http://127.0.0.1:{free_port()}", trust_env=False) as http:
            sweeper = StagingSweep(
                FamilyReports(ProtocolClient(http, "mf.x.y"), ARTIFACT_FAMILY),
                [str(root)],
                period_s=60,
                max_age_s=600,
            )
            removed = await sweeper.when_due()
            assert await sweeper.when_due() == [], "not due again within the period"
            return removed

    removed = asyncio.run(sweep())
    assert removed == [uuid.UUID(old.name)]
    assert not old.exists()
    assert fresh.exists() and not_ours.exists()
