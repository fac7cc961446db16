"""Which claim loop a job notification wakes (agent/jobs/wakeups.py), as pure functions:
the kind the note names, or every loop when it names none (an older API)."""

from __future__ import annotations

import pytest

from agent.jobs.wakeups import Wakeups, note_kind
from schemas.jobs import JobKind

pytestmark = pytest.mark.fast


async def test_a_note_wakes_the_loops_of_its_kind_and_a_kindless_one_every_loop() -> None:
    wakeups = Wakeups()
    artifact = wakeups.loop_for([JobKind.ARTIFACT_ACQUIRE])
    runtime = wakeups.loop_for([JobKind.RUNTIME_PROBE, JobKind.RUNTIME_UNLOAD])
    wakeups.note(JobKind.RUNTIME_UNLOAD.value)
    assert runtime.is_set() and not artifact.is_set()
    runtime.clear()
    wakeups.note("deployment.invoke.v1")  # a kind no loop here claims
    assert not runtime.is_set() and not artifact.is_set()
    wakeups.note(None)
    assert runtime.is_set() and artifact.is_set()


def test_the_kind_is_read_from_the_note_or_left_unknown() -> None:
    assert note_kind('{"event":"job.created","job_id":"x","kind":"artifact.acquire.v1"}') == (
        "artifact.acquire.v1"
    )
    assert note_kind('{"event":"job.created","job_id":"x"}') is None
    assert note_kind('{"event":"job.created","kind":null}') is None
    assert note_kind('{"kind": 3}') is None
    assert note_kind("not json") is None
    assert note_kind("[1, 2]") is None
