"""Test plugins: real PostgreSQL and NATS (tests/services.py) and a real API on loopback
(tests/api_server.py).

Every service is a fixture, started only for a test that asks for it (none is autouse),
so the fast tier (`-m fast`) starts none."""

from __future__ import annotations

from pathlib import Path

import pytest

# contract_helpers: the module-scoped `shared_api` of the error-contract tests.
pytest_plugins = [
    "tests.services",
    "tests.pipeline",
    "tests.api_server",
    "tests.contract_helpers",
    "tests.up_process",
    "tests.worker_processes",
    "tests.hub_server",
    "tests.node_locks",
    "tests.ui_helpers",
]

SCHEMATHESIS = Path(__file__).resolve().parent / "test_schemathesis.py"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """A fast-tier run leaves out tests/test_schemathesis.py, which has no fast test:
    schemathesis builds its cases while collecting, most of such a run's time."""
    if config.getoption("markexpr") == "fast" and collection_path == SCHEMATHESIS:
        return True
    return None
