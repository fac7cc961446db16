"""A job family's report calls under a lease (agent/jobs/lease.py: Reports), on the
routes its declaration names (schemas/jobs.py: JobFamily): one adapter for every family,
so a kind's job holds its family's and a new kind brings none of its own."""

from __future__ import annotations

import uuid

from agent.client import ProtocolClient
from schemas.base import WireModel
from schemas.jobs import FailAnswer, JobFamily, ProgressAnswer


class FamilyReports:
    """Progress, complete and fail for the jobs of `family`. Each report is the job's
    kind's own (its progress, completion or failure model); the control plane checks
    it against the declaration."""

    def __init__(self, client: ProtocolClient, family: JobFamily) -> None:
        self.client = client
        self.family = family

    async def progress(self, job_id: uuid.UUID, report: WireModel) -> ProgressAnswer:
        return await self.client.progress(self.family, job_id, report)

    async def complete(self, job_id: uuid.UUID, report: WireModel) -> WireModel:
        return await self.client.complete(self.family, job_id, report)

    async def fail(self, job_id: uuid.UUID, report: WireModel) -> FailAnswer:
        return await self.client.fail(self.family, job_id, report)
