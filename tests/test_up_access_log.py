"""`up --access-log`'s lines: one line per request, whatever its path holds."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from api.middleware.access_log import configure_access_log, logger, record_access

pytestmark = pytest.mark.fast


@pytest.fixture(autouse=True)
def _as_it_was() -> Iterator[None]:
    # The logger's switch is process-wide: the other tests find it as they left it.
    was = logger.disabled
    yield
    logger.disabled = was


def test_a_path_cannot_forge_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    configure_access_log(True)
    with caplog.at_level(logging.INFO, logger="modelforge.api.access"):
        # What an ASGI server hands over for /x%0a...%1b[2J: decoded.
        record_access("GET", "/x\n2026-12-05 INFO forged line\x1b[2J", 404, 0.001)
        record_access("GET", "/api/v1/nodes", 200, 0.001)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "GET /x\\n2026-12-05 INFO forged line\\x1b[2J 404 1.0ms"
    assert lines[1] == "GET /api/v1/nodes 200 1.0ms"


def test_turned_off_it_writes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    configure_access_log(False)
    with caplog.at_level(logging.INFO, logger="modelforge.api.access"):
        record_access("GET", "/api/v1/nodes", 200, 0.001)
    assert not caplog.records
