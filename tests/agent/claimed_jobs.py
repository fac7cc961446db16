"""An artifact job of one file, created through the real API and claimed in this process
with the agent's own client: for the tests that run the lease runner in process."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from agent.client import ProtocolClient, make_http_client
from agent.jobs.artifact import ArtifactJob, ArtifactSettings
from agent.jobs.reports import FamilyReports
from agent.sources.hub import HubSource, source_session
from schemas.artifacts import ARTIFACT_FAMILY, ArtifactClaim
from tests.api_server import RunningApi
from tests.artifact_flows import create_job, file_entry, node_with_roots
from tests.flows import EnrolledNode
from tests.hub_server import HubServer


def one_file_job(
    api: RunningApi, root: Path, repository: str, commit: str, name: str, data: bytes,
    **job: Any,
) -> tuple[EnrolledNode, str]:  # fmt: skip
    """A node offering `root` and a job for one file there: (node, job id)."""
    with api.client() as operator:
        node = node_with_roots(operator, api, roots=[str(root)])
        manifest = {"repository": repository, "commit": commit,
                    "files": [file_entry(name, data)]}  # fmt: skip
        response = create_job(operator, api, node, target_root=str(root), manifest=manifest, **job)
        assert response.status_code == 201, response.text
    return node, str(response.json()["id"])


@asynccontextmanager
async def claimed(
    api: RunningApi, node: EnrolledNode, hub: HubServer
) -> AsyncIterator[tuple[ProtocolClient, ArtifactClaim, HubSource]]:
    """The node's next artifact job, claimed: its client, the claim and the source."""
    async with (
        make_http_client(api.base_url, trust_env=False) as http,
        aiohttp.ClientSession() as session,
    ):
        client = ProtocolClient(http, node.credential)
        claim = await client.claim(ARTIFACT_FAMILY)
        assert isinstance(claim, ArtifactClaim), claim
        yield client, claim, HubSource(hub.url, None, session)


@asynccontextmanager
async def running_job(
    api: RunningApi, node: EnrolledNode, hub: HubServer, root: Path, token: str | None = None
) -> AsyncIterator[ArtifactJob]:
    """The node's next artifact job, claimed, downloading with the agent's own session
    (its redirect rules and resolver included)."""
    settings = ArtifactSettings(roots=[str(root)], progress_interval_s=0.5, stall_s=10)
    async with (
        make_http_client(api.base_url, trust_env=False) as http,
        source_session(
            hub.url, stall_s=settings.stall_s, connect_timeout_s=5, trust_env=False
        ) as session,
    ):
        client = ProtocolClient(http, node.credential)
        claim = await client.claim(ARTIFACT_FAMILY)
        assert isinstance(claim, ArtifactClaim), claim
        source = HubSource(hub.url, token, session)
        yield ArtifactJob(claim, FamilyReports(client, ARTIFACT_FAMILY), source, settings)
