"""Each process runs every kind of the families it serves, each by one executor whose
claim is the kind's declared one (agent/jobs/dispatch.py): a kind declared but not
run here, or run with another claim than the route hands out, fails here rather than
as a lease left to run out on a node."""

from __future__ import annotations

from typing import Any

import pytest

from agent.client import ProtocolClient, make_http_client
from agent.jobs.dispatch import Executor, FamilyJobs, declared_in
from agent.runner import ARTIFACT_EXECUTORS_PACKAGE
from agent.runtime.control import EXECUTORS_PACKAGE
from agent.runtime.probe import ProbeRun
from schemas.artifacts import ARTIFACT_FAMILY
from schemas.deployments import DEPLOYMENT_FAMILY
from schemas.jobs import JobFamily, JobKind
from schemas.runtime import RUNTIME_FAMILY, ProbeClaim

pytestmark = pytest.mark.fast

ARTIFACT_EXECUTORS = declared_in(ARTIFACT_EXECUTORS_PACKAGE, ARTIFACT_FAMILY)
RUNTIME_EXECUTORS = declared_in(EXECUTORS_PACKAGE, RUNTIME_FAMILY)
DEPLOYMENT_EXECUTORS = declared_in(EXECUTORS_PACKAGE, DEPLOYMENT_FAMILY)


@pytest.mark.parametrize(
    ("family", "executors"),
    [
        (ARTIFACT_FAMILY, ARTIFACT_EXECUTORS),
        (RUNTIME_FAMILY, RUNTIME_EXECUTORS),
        (DEPLOYMENT_FAMILY, DEPLOYMENT_EXECUTORS),
    ],
)
def test_every_kind_of_a_served_family_has_one_executor(
    family: JobFamily, executors: tuple[Executor[object, object], ...]
) -> None:
    kinds = [executor.kind for executor in executors]
    assert len(set(kinds)) == len(kinds), kinds
    missing = set(family.kinds) - set(kinds)
    assert not missing, f"declared, but no executor here runs it: {sorted(missing)}"
    assert set(kinds) <= set(family.kinds)
    for executor in executors:
        assert executor.claim is family.of(executor.kind).claim


def test_an_executor_takes_only_its_kinds_declared_claim() -> None:
    with pytest.raises(TypeError, match=r"runtime\.health\.v1"):
        Executor(JobKind.RUNTIME_HEALTH, ProbeClaim, ProbeRun)


async def test_a_family_serves_only_its_own_kinds() -> None:
    async with make_http_client("http://127.0.0.1:9", trust_env=False) as http:
        client = ProtocolClient(http, "mf.x.y")
        with pytest.raises(ValueError, match="not a deployment job"):
            FamilyJobs[Any](client, DEPLOYMENT_FAMILY, RUNTIME_EXECUTORS, None)
        with pytest.raises(ValueError, match="two executors"):
            FamilyJobs[Any](client, RUNTIME_FAMILY, (*RUNTIME_EXECUTORS, *RUNTIME_EXECUTORS), None)
