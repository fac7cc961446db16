"""Every job family the control plane serves, in one list: the agent routes, the
results table and the admin views are built from it, so a family (or a kind of one)
that is declared is served, and one that is not is not. Apart from schemas/jobs.py
because each declaration is built on that module's lease types."""

from __future__ import annotations

from typing import Final

from schemas.artifacts import ARTIFACT_FAMILY
from schemas.deployments import DEPLOYMENT_FAMILY
from schemas.jobs import JobType
from schemas.runtime import RUNTIME_FAMILY

FAMILIES: Final = (ARTIFACT_FAMILY, RUNTIME_FAMILY, DEPLOYMENT_FAMILY)


def job_type(kind: str) -> JobType:
    """The declaration of a kind (a job's `kind` column), whatever its family."""
    for family in FAMILIES:
        if kind in family.kinds:
            return family.of(kind)
    raise ValueError(f"{kind} is not a declared job kind")


def capabilities() -> tuple[str, ...]:
    """What a node advertises to be handed each kind that needs one."""
    return tuple(t.capability for f in FAMILIES for t in f.types if t.capability is not None)
