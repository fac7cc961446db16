"""Fixtures of the agent tests (the services and api_factory come from tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.agent.harness import agents
from tests.up_process import UpProcess

__all__ = ["agents", "modelforge_up"]


@pytest.fixture
def modelforge_up() -> Iterator[Callable[[Path, int], UpProcess]]:
    """`python -m cli.main up` processes, killed with everything below them at teardown."""
    started: list[UpProcess] = []

    def start(data_dir: Path, port: int) -> UpProcess:
        started.append(UpProcess(data_dir, port))
        return started[-1]

    yield start
    for up in started:
        up.kill()
