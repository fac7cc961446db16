"""Which executor runs each job kind a process claims. A family's claims come from one
claim loop (agent/jobs/loop.py); each is handed, by its `kind`, to that kind's executor,
which makes it a job under its lease (agent/jobs/lease.py: LeasedJob).

An executor is declared once, in its own module, beside the job it starts
(agent/jobs/artifact.py: EXECUTORS; agent/runtime/probe.py, device_jobs.py,
deployments.py), and each process collects those of the families it serves from its own
package (`declared_in`: agent/runner.py reads agent/jobs/, agent/runtime/control.py
reads agent/runtime/). A new kind of a family the process already serves is its
declaration (schemas/) and its executor module: no list to extend, no dispatch to
extend, no report calls to add (agent/jobs/reports.py). Collected rather than listed by
hand so that a kind cannot be declared, built and then forgotten in a list; that every
declared kind has exactly one executor is checked by tests/agent/test_executors.py.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from agent.client import Claim, ProtocolClient
from agent.jobs.loop import Job
from agent.jobs.reports import FamilyReports
from schemas.job_families import job_type
from schemas.jobs import JobFamily, JobKind

logger = logging.getLogger("modelforge.agent.jobs")

ClaimT = TypeVar("ClaimT")
# What the process gives every executor of a family beside the claim and the reports
# (the artifact kinds: their source and settings; the runtime kinds: the worker).
Context = TypeVar("Context")


@dataclass(frozen=True)
class Executor(Generic[ClaimT, Context]):
    """How this process runs one kind: `start` makes its claim a job."""

    kind: JobKind
    # The kind's declared claim (schemas/jobs.py: JobType.claim), checked here so that
    # what `start` is typed to take is what the claim route hands out.
    claim: type[ClaimT]
    start: Callable[[ClaimT, FamilyReports, Context], Job]

    def __post_init__(self) -> None:
        declared = job_type(self.kind).claim
        if self.claim is not declared:
            raise TypeError(f"{self.kind} is claimed as {declared.__name__}, not as {self.claim}")

    def job(self, claim: Claim, reports: FamilyReports, context: Context) -> Job:
        if not isinstance(claim, self.claim):
            raise TypeError(f"a {self.kind} claim parsed as {type(claim).__name__}")
        return self.start(claim, reports, context)


def declared_in(package: str, family: JobFamily) -> tuple[Executor[Any, Any], ...]:
    """The executors of `family`'s kinds that the modules of `package` declare (each
    module's EXECUTORS), in module order. Read when a process starts its loops, never at
    import, so no module of the package is imported before it is needed."""
    found: list[Executor[Any, Any]] = []
    modules = importlib.import_module(package).__path__
    for info in pkgutil.iter_modules(modules, f"{package}."):
        declared = getattr(importlib.import_module(info.name), "EXECUTORS", ())
        found.extend(executor for executor in declared if executor.kind in family.kinds)
    return tuple(found)


class NotServed(Exception):
    """A claim of a kind this process has no executor for: its lease runs out."""


class FamilyJobs(Generic[Context]):
    """One family's jobs in this process: its claims, each run by its kind's executor,
    reporting through the family's routes."""

    def __init__(
        self,
        client: ProtocolClient,
        family: JobFamily,
        executors: Iterable[Executor[Any, Context]],
        context: Context,
    ) -> None:
        self.client = client
        self.family = family
        self.reports = FamilyReports(client, family)
        self.context = context
        self.executors: dict[JobKind, Executor[Any, Context]] = {}
        for executor in executors:
            if executor.kind not in family.kinds:
                raise ValueError(f"{executor.kind} is not a {family.name} job")
            if executor.kind in self.executors:
                raise ValueError(f"{executor.kind} has two executors")
            self.executors[executor.kind] = executor

    @property
    def what(self) -> str:
        """The claim loop's name in the log ("artifact jobs")."""
        return f"{self.family.name} jobs"

    async def next_job(self) -> Job | None:
        """The family's next claim as a job ready to run; None when there is none."""
        claim = await self.client.claim(self.family)
        if claim is None:
            return None
        logger.info(
            "claimed %s job %s (%s, attempt %d)",
            self.family.name,
            claim.job_id,
            claim.kind,
            claim.attempt,
        )
        executor = self.executors.get(JobKind(claim.kind))
        if executor is None:
            raise NotServed(f"no executor for {claim.kind} in this process")
        return executor.job(claim, self.reports, self.context)
