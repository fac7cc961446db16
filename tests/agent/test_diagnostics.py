"""The log setup: HTTP libraries at WARNING even at DEBUG, secrets masked, one failure line."""

from __future__ import annotations

import io
import logging
import uuid
from collections.abc import Iterator

import pytest

from agent.diagnostics import QUIET_LOGGERS, configure_logging, failure_line, redact
from agent.errors import FailureClass, Transient

pytestmark = pytest.mark.fast

CREDENTIAL = f"mfn.{uuid.uuid4().hex}.diagnostics-secret-0123456789"
TOKEN = f"mfe.{uuid.uuid4().hex}.diagnostics-token-0123456789"


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, {n: logging.getLogger(n).level for n in QUIET_LOGGERS})
    stream = io.StringIO()
    configure_logging("DEBUG", stream)
    yield stream
    root.handlers[:], root.level = saved[0], saved[1]
    for name, level in saved[2].items():
        logging.getLogger(name).setLevel(level)


def test_http_libraries_stay_at_warning_with_the_agent_at_debug(captured: io.StringIO) -> None:
    for name in ("httpx", "httpcore", "httpcore.http11", "httpcore.connection"):
        assert logging.getLogger(name).getEffectiveLevel() == logging.WARNING
        logging.getLogger(name).debug("send_request_headers %s", {"authorization": CREDENTIAL})
        logging.getLogger(name).info("HTTP Request: POST ... Authorization: Bearer %s", TOKEN)
    logging.getLogger("modelforge.agent").debug("agent debug line")
    output = captured.getvalue()
    assert "agent debug line" in output
    assert "send_request_headers" not in output and "HTTP Request" not in output


def test_anything_shaped_like_a_secret_is_masked_as_a_last_resort(captured: io.StringIO) -> None:
    logging.getLogger("modelforge.agent").error(
        "oops %s / Bearer %s / %s", CREDENTIAL, "abc", TOKEN
    )
    output = captured.getvalue()
    assert CREDENTIAL not in output and TOKEN not in output and "Bearer abc" not in output
    # The id part is kept: it names the credential without revealing it.
    assert CREDENTIAL.split(".")[1] in output
    assert redact("nothing secret here") == "nothing secret here"


def test_the_failure_line_names_status_method_path_and_class() -> None:
    error = Transient(
        method="PUT",
        path="/api/v1/agent/telemetry",
        failure_class=FailureClass.HTTP,
        status=503,
        correlation_id="c-9",
    )
    line = failure_line("telemetry", error, "retrying in 1.0s")
    assert line == (
        "telemetry failed: method=PUT path=/api/v1/agent/telemetry status=503 class=http "
        "correlation_id=c-9; retrying in 1.0s"
    )
    refused = Transient(
        method="POST",
        path="/api/v1/agent/heartbeat",
        failure_class=FailureClass.REFUSED,
        detail="connection refused",
    )
    assert "status=none class=refused detail='connection refused'" in str(refused)
