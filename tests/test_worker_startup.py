"""A worker's start waits out a JetStream that cannot answer, and only that (the fast
tier: the classification and the retry loop, on fabricated broker errors). The real
cluster without quorum is in tests/test_nats_cluster.py."""

from __future__ import annotations

import logging
import threading

import nats.errors
import pytest
from nats.js.errors import BadRequestError, ServiceUnavailableError

from broker.jetstream.errors import connection_closed, connection_failed, unavailable
from broker.jetstream.loop import WaitExpired
from workers.startup import wait_for_jetstream

pytestmark = pytest.mark.fast


def failed(cause: BaseException) -> Exception:
    """As the broker raises it: dramatiq's error, the NATS one as its cause."""
    error = connection_failed(cause)
    error.__cause__ = cause
    return error


def test_what_passes_on_its_own_is_told_from_a_refusal() -> None:
    passing = [
        nats.errors.TimeoutError(),
        WaitExpired("broker operation did not finish within 20.0s"),
        nats.errors.NoRespondersError(),
        nats.errors.NoServersError(),
        ConnectionRefusedError(),
        ServiceUnavailableError(code=503, err_code=10008),
        BadRequestError(code=400, err_code=10005),  # no suitable peers: servers down
    ]
    for cause in passing:
        assert unavailable(failed(cause)), cause
    closed = connection_closed(nats.errors.TimeoutError())
    closed.__cause__ = nats.errors.TimeoutError()
    assert unavailable(closed)
    # A configuration JetStream refuses: waiting would hide it.
    assert not unavailable(failed(BadRequestError(code=400, err_code=10058)))
    assert not unavailable(ValueError("a bug"))


def test_the_start_is_retried_until_jetstream_answers(caplog: pytest.LogCaptureFixture) -> None:
    outcomes: list[BaseException | str] = [
        failed(nats.errors.TimeoutError()),
        failed(ServiceUnavailableError(code=503, err_code=10008)),
        "started",
    ]

    def start() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    with caplog.at_level(logging.WARNING, logger="modelforge.workers"):
        got = wait_for_jetstream(start, threading.Event(), initial_s=0.01, max_s=0.05)
    assert got == "started"
    waits = [r for r in caplog.records if "JetStream is not ready" in r.getMessage()]
    assert len(waits) == 2, caplog.text
    assert all(r.exc_info is None for r in waits)  # one line each, no traceback
    assert "nats.errors.TimeoutError: nats: timeout" in waits[0].getMessage()
    assert "(attempt 2)" in waits[0].getMessage()


def test_a_refusal_is_raised_at_once() -> None:
    calls = 0
    refusal = failed(BadRequestError(code=400, err_code=10058))

    def start() -> None:
        nonlocal calls
        calls += 1
        raise refusal

    with pytest.raises(type(refusal)):
        wait_for_jetstream(start, threading.Event(), initial_s=0.01, max_s=0.05)
    assert calls == 1


def test_a_stop_request_ends_the_wait() -> None:
    stop = threading.Event()
    calls = 0

    def start() -> None:
        nonlocal calls
        calls += 1
        stop.set()
        raise failed(nats.errors.TimeoutError())

    assert wait_for_jetstream(start, stop, initial_s=30, max_s=60) is None
    assert calls == 1
