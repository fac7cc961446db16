"""The runtime kinds' glue to the one lease runner (agent/jobs/lease.py): their failure
(a RuntimeFailure, with the layered health when the failure came from the server) and
their progress (the phase). agent/runtime/probe.py, device_jobs.py and deployments.py
do the work, each kind started by the executor its module declares
(agent/jobs/dispatch.py); their reports go through their family's routes
(agent/jobs/reports.py: FamilyReports)."""

from __future__ import annotations

import logging
import uuid
from typing import Literal

from typing_extensions import TypeVar

from agent.jobs.lease import Failed, LeasedJob, Reports, report_every
from agent.runtime.worker import RuntimeWorker
from schemas.jobs import JobKind, Lease
from schemas.runtime import (
    HealthComplete,
    ProbeComplete,
    RuntimeFailure,
    RuntimeJobFail,
    RuntimeJobProgress,
    ServerHealth,
    UnloadComplete,
)

logger = logging.getLogger("modelforge.runtime.jobs")

# Worth another attempt: the next start may well succeed.
RETRYABLE = frozenset(
    {RuntimeFailure.STARTUP_TIMEOUT, RuntimeFailure.PROCESS_EXITED, RuntimeFailure.INTERNAL}
)

Completion = ProbeComplete | HealthComplete | UnloadComplete
# A kind's completion report (the deployment kinds complete with their own models).
Done = TypeVar("Done", default=Completion)
# The report calls a runtime kind's job makes (agent/jobs/reports.py: FamilyReports).
RuntimeReports = Reports[RuntimeJobProgress, Completion, RuntimeJobFail]
Phase = Literal["verifying", "loading", "probing", "draining", "unloading"]


class RuntimeFailed(Failed):
    """A runtime job's failure; retryable by its code, with the health seen if any."""

    def __init__(
        self, code: RuntimeFailure, detail: str, health: ServerHealth | None = None
    ) -> None:
        super().__init__(code, detail, retryable=code in RETRYABLE)
        self.health = health


class RuntimeJob(LeasedJob[RuntimeJobProgress, Done, RuntimeJobFail]):
    """Any runtime kind (and deployment kind: agent/runtime/deployments.py) under its
    lease: progress reports name the phase."""

    cancelled_code = RuntimeFailure.CANCELLED
    internal_code = RuntimeFailure.INTERNAL

    def __init__(
        self,
        job_id: uuid.UUID,
        kind: JobKind,
        lease: Lease,
        reports: Reports[RuntimeJobProgress, Done, RuntimeJobFail],
        worker: RuntimeWorker,
    ) -> None:
        super().__init__(
            job_id,
            lease,
            reports,
            name=f"{kind.value} {job_id}",
            report_every_s=report_every(lease),
        )
        self.kind = kind
        self.worker = worker
        self.phase: Phase = "verifying"

    async def run(self) -> str:
        try:
            return await super().run()
        finally:
            self.worker.changed.set()  # a runtime report soon after every job

    def progress_report(self) -> RuntimeJobProgress:
        return RuntimeJobProgress(lease=self.fence, phase=self.phase)

    def fail_report(self, failure: Failed) -> RuntimeJobFail:
        return RuntimeJobFail(
            lease=self.fence,
            code=RuntimeFailure(failure.code),
            retryable=failure.retryable,
            detail=failure.detail,
            health=failure.health if isinstance(failure, RuntimeFailed) else None,
        )
