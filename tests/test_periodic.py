"""api/periodic.py: the loop every periodic writer and the routing table's read ahead
share. No database: the steps here are plain coroutines."""

from __future__ import annotations

import asyncio
import logging

import pytest
from sqlalchemy.exc import OperationalError

from api.periodic import Outage, repeat

pytestmark = pytest.mark.fast
LOGGER = "modelforge.test.periodic"


class Steps:
    """Fails as told, one entry per call (True: raise), then succeeds."""

    def __init__(self, fail: list[BaseException | None], did: int = 1) -> None:
        self.fail = fail
        self.did = did
        self.calls = 0
        self.done = asyncio.Event()

    async def __call__(self) -> int:
        self.calls += 1
        if self.calls > len(self.fail):
            self.done.set()
        elif (error := self.fail[self.calls - 1]) is not None:
            raise error
        return self.did


async def _run(steps: Steps, *, after_stop: bool, outage: Outage) -> int:
    """Run until the steps are spent, stop, and return how many calls came after."""
    stop = asyncio.Event()
    task = asyncio.create_task(repeat(steps, stop, 0.001, outage, after_stop=after_stop))
    await asyncio.wait_for(steps.done.wait(), 10)
    before = steps.calls
    stop.set()
    await asyncio.wait_for(task, 10)
    return steps.calls - before


async def test_an_outage_is_said_once_by_kind_and_its_end_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    secret = OperationalError("SELECT 1", {"password": "secret-pw"}, OSError("refused"))
    steps = Steps([secret, OSError("postgres://u:secret-pw@h"), secret])
    outage = Outage(logging.getLogger(LOGGER), "the thing", "works again")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        await _run(steps, after_stop=False, outage=outage)
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert lines == ["the thing failed (OperationalError); retrying", "the thing works again"]
    assert not any(r.exc_info for r in caplog.records)


async def test_a_defect_keeps_the_loop_and_says_where(caplog: pytest.LogCaptureFixture) -> None:
    steps = Steps([KeyError("x"), KeyError("x")])
    outage = Outage(logging.getLogger(LOGGER), "the thing", "works again")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        await _run(steps, after_stop=False, outage=outage)
    errors = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None
    assert steps.calls >= 3  # went on after it


async def test_an_empty_step_ends_no_outage(caplog: pytest.LogCaptureFixture) -> None:
    steps = Steps([OSError()], did=0)
    outage = Outage(logging.getLogger(LOGGER), "the thing", "works again")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        await _run(steps, after_stop=False, outage=outage)
    assert outage.failing  # nothing was written: nothing proved the database back
    assert [r.levelno for r in caplog.records if r.name == LOGGER] == [logging.WARNING]


async def test_a_writer_steps_once_more_after_the_stop_and_a_reader_does_not() -> None:
    outage = Outage(logging.getLogger(LOGGER), "the thing", "works again")
    assert await _run(Steps([]), after_stop=True, outage=outage) == 1
    assert await _run(Steps([]), after_stop=False, outage=outage) == 0
