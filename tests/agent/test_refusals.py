"""What the publishing loops do with each kind of failure, in-process against the real API
behind the fault proxy (tests/agent/proxy.py), which answers scripted statuses for some
requests and relays the rest:

* any 4xx but 401/403 is final for its payload: one log line, no retry, the next payload
  follows with the next sequence number (and is accepted);
* transport errors and 5xx are retried, but only retry_max_attempts times per payload;
* a replayed sequence (409 sequence_replayed) moves the cursor past the server's, with or
  without the cursor in the answer, and publishing recovers.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agent.client import ProtocolClient, make_http_client
from agent.publisher import Publisher, Timing
from agent.sequencing import UNKNOWN_CURSOR_SKIP
from agent.state import Sequences, StateDir
from schemas.agent import InventoryReport, TelemetryReport
from tests.agent.proxy import CLOSE, FaultProxy, Scripted, Seen
from tests.agent.test_publisher import FixedHost, SwitchableCollector, eventually
from tests.api_server import RunningApi
from tests.flows import HEARTBEAT, INVENTORY, NODES, TELEMETRY, EnrolledNode, enroll

ApiFactory = Callable[..., RunningApi]
TELEMETRY_EVERY_S = 0.5


@pytest.fixture
def proxy_for() -> Iterator[Callable[[RunningApi], FaultProxy]]:
    made: list[FaultProxy] = []

    def make(api: RunningApi) -> FaultProxy:
        made.append(FaultProxy(api.base_url).start())
        return made[-1]

    yield make
    for proxy in made:
        proxy.close()


@dataclass
class Running:
    publisher: Publisher
    stop: asyncio.Event
    task: asyncio.Task[Any]


def make_publisher(
    client: ProtocolClient, node: EnrolledNode, sequences: Sequences, **timing: Any
) -> Publisher:
    return Publisher(
        client=client,
        node_id=uuid.UUID(node.node_id),
        sequences=sequences,
        collector=SwitchableCollector(),
        host=FixedHost(),
        timing=Timing(
            **{
                "telemetry_interval_s": TELEMETRY_EVERY_S,
                "inventory_check_interval_s": 0.1,
                "inventory_interval_s": 60,
                "retry_initial_s": 0.02,
                "retry_max_s": 0.05,
                **timing,
            }
        ),
        server_heartbeat_interval_s=0.2,
    )


def stream_cursor(api: RunningApi, node: EnrolledNode, stream: str) -> int:
    with api.client() as client:
        detail = client.get(f"{NODES}/{node.node_id}", headers=api.admin_headers).json()
    value: int = (detail[f"{stream}_stream"] or {}).get("cursor", 0)
    return value


def sequences_of(requests: list[Seen]) -> list[int]:
    sequences = [s.sequence for s in requests if s.sequence is not None]
    assert len(sequences) == len(requests), requests
    return sequences


def failure_lines(caplog: pytest.LogCaptureFixture, path: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "modelforge.agent" and " failed: method=" in r.getMessage()
        if f"path={path} " in r.getMessage()
    ]


def assert_no_body_logged(caplog: pytest.LogCaptureFixture, node: EnrolledNode) -> None:
    for record in caplog.records:
        message = record.getMessage()
        # The proxy's error bodies echo the request body and the Authorization header.
        assert node.credential not in message and "echo" not in message, message
        assert "ram_used_bytes" not in message and "authorization" not in message, message


async def test_a_4xx_is_final_for_its_payload_and_the_next_payload_follows(
    api_factory: ApiFactory,
    proxy_for: Callable[[RunningApi], FaultProxy],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="modelforge.agent")
    api = api_factory(heartbeat_interval_s=0.2)
    proxy = proxy_for(api)
    with api.client() as admin:
        node = enroll(admin, api)
    refusals = [
        Scripted(422, "validation_failed"),
        Scripted(413, "body_too_large"),
        # A 409 other than the protocol and identity ones refuses the payload only.
        Scripted(409, "state_conflict"),
        Scripted(404, "not_found"),
        Scripted(400, "a_code_from_a_newer_server"),
    ]
    proxy.script(TELEMETRY, *refusals)
    proxy.script(HEARTBEAT, Scripted(405, "method_not_allowed"))
    proxy.script(INVENTORY, Scripted(422, "validation_failed"))

    async with make_http_client(proxy.url, trust_env=False) as http:
        publisher = make_publisher(ProtocolClient(http, node.credential), node, Sequences(None))
        collector = publisher.collector
        assert isinstance(collector, SwitchableCollector)
        stop = asyncio.Event()
        running = asyncio.create_task(publisher.run(stop))
        try:

            def accepted(path: str) -> list[Seen]:
                return [s for s in proxy.requests_to(path) if s.status == 200]

            await eventually(lambda: _true(len(accepted(TELEMETRY)) >= 2))
            await eventually(lambda: _true(len(accepted(HEARTBEAT)) >= 2))
            # The refused inventory is not sent again while it is unchanged...
            await asyncio.sleep(0.5)  # a window for a resend that must not come: no wait
            assert [s.status for s in proxy.requests_to(INVENTORY)] == [422]
            # ...and a changed one is sent, with a higher sequence, and accepted.
            collector.visible = 1
            await eventually(lambda: _true(len(accepted(INVENTORY)) == 1))
        finally:
            stop.set()
            assert await asyncio.wait_for(running, 10) is None  # refusals never stop it

    telemetry = proxy.requests_to(TELEMETRY)
    statuses = [s.status for s in telemetry]
    assert statuses[: len(refusals) + 1] == [r.status for r in refusals] + [200]
    # One request per payload: each refused sample was dropped, not retried; the next one
    # came a telemetry interval later (a retry would have followed within ~0.05 s).
    for earlier, later in itertools.pairwise(telemetry[: len(refusals) + 1]):
        assert later.at - earlier.at > TELEMETRY_EVERY_S * 0.8, statuses
    sequences = sequences_of(telemetry)
    assert sequences == sorted(set(sequences))  # kept advancing: never a replay
    assert stream_cursor(api, node, "telemetry") == sequences[-1]
    inventory = proxy.requests_to(INVENTORY)
    assert inventory[1].sequence and inventory[0].sequence
    assert inventory[1].sequence > inventory[0].sequence

    # Logged once each, in the diagnostics format, never with the body.
    lines = failure_lines(caplog, TELEMETRY)
    assert len(lines) == len(refusals), lines
    for line, seen, answer in zip(lines, telemetry, refusals, strict=False):
        assert line.startswith(
            f"telemetry failed: method=PUT path={TELEMETRY} status={answer.status} class=http"
        ), line
        assert f"correlation_id={seen.correlation_id}" in line
        assert line.endswith("; final for this payload: dropped, not retried; the next one follows")
    assert "code=validation_failed" in lines[0] and "code=state_conflict" in lines[2]
    assert " code=" not in lines[4]  # an unknown code is not guessed at
    assert len(failure_lines(caplog, HEARTBEAT)) == 1
    assert "status=405 class=http code=method_not_allowed" in failure_lines(caplog, HEARTBEAT)[0]
    assert len(failure_lines(caplog, INVENTORY)) == 1
    assert_no_body_logged(caplog, node)
    assert publisher.stats.failures == {
        "telemetry http 422": 1,
        "telemetry http 413": 1,
        "telemetry http 409": 1,
        "telemetry http 404": 1,
        "telemetry http 400": 1,
        "heartbeat http 405": 1,
        "inventory http 422": 1,
    }


async def test_transient_failures_are_retried_a_bounded_number_of_times_per_payload(
    api_factory: ApiFactory,
    proxy_for: Callable[[RunningApi], FaultProxy],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="modelforge.agent")
    api = api_factory(heartbeat_interval_s=0.2)
    proxy = proxy_for(api)
    with api.client() as admin:
        node = enroll(admin, api)
    # Two payloads' worth of failures: three 503s, then three connections closed unanswered.
    proxy.script(TELEMETRY, *[Scripted(503)] * 3, *[Scripted(CLOSE)] * 3)

    async with make_http_client(proxy.url, trust_env=False) as http:
        publisher = make_publisher(
            ProtocolClient(http, node.credential), node, Sequences(None), retry_max_attempts=3
        )
        stop = asyncio.Event()
        running = asyncio.create_task(publisher.run(stop))
        try:
            await eventually(
                lambda: _true(sum(s.status == 200 for s in proxy.requests_to(TELEMETRY)) >= 1)
            )
        finally:
            stop.set()
            assert await asyncio.wait_for(running, 10) is None

    telemetry = proxy.requests_to(TELEMETRY)
    assert [s.status for s in telemetry[:7]] == [503] * 3 + [CLOSE] * 3 + [200]
    # Each payload stopped after 3 attempts; the next one came a telemetry interval later.
    assert telemetry[3].at - telemetry[2].at > TELEMETRY_EVERY_S * 0.8
    assert telemetry[6].at - telemetry[5].at > TELEMETRY_EVERY_S * 0.8
    # Every attempt was a fresh sample with a new sequence, so the server took the last.
    sequences = sequences_of(telemetry)
    assert sequences == sorted(set(sequences))
    assert stream_cursor(api, node, "telemetry") == sequences[-1]

    lines = failure_lines(caplog, TELEMETRY)
    gave_up = [line for line in lines if "gave up after 3 attempts" in line]
    assert len(gave_up) == 2, lines
    assert "status=503 class=http code=internal_error" in gave_up[0]
    assert "status=none class=connection" in gave_up[1]
    assert all(
        line.endswith("dropped, newer state is sent at the next interval") for line in gave_up
    )
    retried = [line for line in lines if "retrying in" in line]
    assert len(retried) == 4 and "(attempt 3 of 3)" in retried[1], retried
    assert_no_body_logged(caplog, node)
    assert publisher.stats.failures == {"telemetry http 503": 3, "telemetry connection -": 3}


async def test_a_replayed_sequence_moves_past_the_server_cursor_and_recovers(
    api_factory: ApiFactory,
    proxy_for: Callable[[RunningApi], FaultProxy],
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    caplog.set_level(logging.INFO, logger="modelforge.agent")
    api = api_factory(heartbeat_interval_s=0.2)
    proxy = proxy_for(api)
    with api.client() as admin:
        node = enroll(admin, api)
    state = StateDir(tmp_path / "state")
    state.prepare()

    async with make_http_client(proxy.url, trust_env=False) as http:
        client = ProtocolClient(http, node.credential)
        # The server is ahead of this state dir (restored from an old backup, say).
        now = datetime.now(UTC)
        node_id = uuid.UUID(node.node_id)
        await client.put_inventory(
            InventoryReport(
                node_id=node_id,
                sequence=300,
                observed_at=now,
                complete=True,
                host=FixedHost().facts(),
            )
        )
        await client.put_telemetry(
            TelemetryReport(
                node_id=node_id, sequence=500, observed_at=now, ram_total_bytes=1, ram_used_bytes=1
            )
        )
        publisher = make_publisher(client, node, Sequences(state, block=4))
        stop = asyncio.Event()
        running = asyncio.create_task(publisher.run(stop))
        try:
            await eventually(lambda: _true(stream_cursor(api, node, "telemetry") > 500))
            await eventually(lambda: _true(stream_cursor(api, node, "inventory") > 300))
            # A replay answer without the server's cursor: the agent skips ahead anyway.
            before = len(proxy.requests_to(TELEMETRY))
            proxy.script(TELEMETRY, Scripted(409, "sequence_replayed", {"stream": "telemetry"}))
            await eventually(
                lambda: _true(
                    [s.status for s in proxy.requests_to(TELEMETRY)[before:]][:2] == [409, 200]
                )
            )
        finally:
            stop.set()
            assert await asyncio.wait_for(running, 10) is None

    warnings = [r.getMessage() for r in caplog.records if "already received" in r.getMessage()]
    assert any(
        "inventory sequence 1 was already received (server cursor 300)" in w for w in warnings
    )
    assert any(
        "telemetry sequence 1 was already received (server cursor 500)" in w for w in warnings
    )
    telemetry = proxy.requests_to(TELEMETRY)
    # The replayed sample was sent again at once, above the server's cursor, and accepted.
    assert [(s.sequence, s.status) for s in telemetry[1:3]] == [(1, 409), (501, 200)]
    replayed, resent = telemetry[before], telemetry[before + 1]
    assert replayed.sequence is not None
    assert resent.sequence == replayed.sequence + UNKNOWN_CURSOR_SKIP + 1
    assert any("(server cursor not reported)" in w for w in warnings)
    assert stream_cursor(api, node, "telemetry") >= resent.sequence
    # The jump is persisted: a restart resumes above the server's cursor.
    cursors = state.load_cursors()
    assert cursors["inventory"] >= 301 and cursors["telemetry"] >= resent.sequence
    # A replay is recovered from, not a failure: nothing was dropped or counted.
    assert failure_lines(caplog, TELEMETRY) == failure_lines(caplog, INVENTORY) == []
    assert publisher.stats.failed == 0
    assert_no_body_logged(caplog, node)


async def _true(value: bool) -> bool:
    return value
