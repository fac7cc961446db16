"""The outbox relay against real PostgreSQL, a real nats-server and the real API.

Every event written to the outbox reaches the JetStream stream exactly once, in
per-node order, as CloudEvents JSON with Nats-Msg-Id = event id, across broker
outages, crashed relays and relays racing each other. The API is driven over HTTP;
the database and the stream are read directly only to verify.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from contextlib import suppress
from pathlib import Path

import nats
import pytest
from nats.js.errors import NoStreamResponseError, NotFoundError

from broker.streams import StreamSpec, declare, events_stream
from stack.embedded_nats import EmbeddedNats
from store.notify import OUTBOX_CHANNEL, listening
from tests.api_server import ApiFactory, RunningApi
from tests.outbox_flows import (
    EVENTS_PER_STORY,
    assert_stream_matches_outbox,
    db_fetch_count,
    drain,
    in_process_relay,
    names,
    publish_raw,
    read_stream,
    relay_process,
    run_stories,
    unsent,
    wait_all_sent,
    wait_until,
)
from tests.services import db_fetch


@pytest.fixture
def api(api_factory: ApiFactory) -> RunningApi:
    """Without the test pipeline: these tests run the relay themselves."""
    return api_factory(pipeline=False)


async def test_broker_outage_delays_events_and_loses_none(
    api: RunningApi, database_url: str, nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """NATS down when the relay starts, and again mid-traffic: the API keeps working,
    the relay keeps running, and afterwards every event is on the stream exactly once."""
    url = nats_server.url
    await asyncio.to_thread(nats_server.stop)
    log = tmp_path / "relay.log"
    with relay_process(database_url, url, log) as relay:
        # 1. No broker at start-up: changes commit, events wait in the outbox.
        await run_stories(api, names("early", 3))
        # A window in which the relay must neither die nor send: not a wait.
        await asyncio.sleep(1.0)
        assert relay.poll() is None, log.read_text()
        assert await unsent(database_url) == 3 * EVENTS_PER_STORY

        # 2. The broker appears (empty: the relay declares the stream) and gets them all.
        await asyncio.to_thread(nats_server.start)
        await wait_all_sent(database_url)
        await assert_stream_matches_outbox(database_url, url)

        # 3. The broker goes away while nodes keep changing, then comes back.
        stop_producing = asyncio.Event()
        rounds = 0

        async def produce() -> None:
            nonlocal rounds
            while not stop_producing.is_set():
                await run_stories(api, names(f"busy{rounds}", 2))
                rounds += 1

        async def rounds_done(count: int) -> None:
            async def reached() -> bool:
                if producer.done():
                    producer.result()  # a failed change fails the test here
                return rounds >= count

            await wait_until(reached, 20, f"{count} rounds of changes", poll_s=0.05)

        producer = asyncio.create_task(produce())
        await rounds_done(1)
        await asyncio.to_thread(nats_server.stop)
        # The API keeps answering, the outbox fills up, the relay keeps retrying.
        await rounds_done(rounds + 2)
        assert relay.poll() is None, log.read_text()
        assert await unsent(database_url) > 0
        await asyncio.to_thread(nats_server.start)
        await rounds_done(rounds + 1)
        stop_producing.set()
        await asyncio.wait_for(producer, 30)

        await wait_all_sent(database_url)
        messages = await assert_stream_matches_outbox(database_url, url)
        assert len(messages) == (3 + 2 * rounds) * EVENTS_PER_STORY
        # The relay is still healthy, and stops promptly on SIGTERM (checked on exit).
    assert "Traceback" not in log.read_text()


async def test_republished_events_are_dropped_by_the_stream(
    api: RunningApi, database_url: str, nats_server: EmbeddedNats
) -> None:
    """A relay that published and crashed before marking, and rows reset to unsent:
    the next relay publishes them again and JetStream keeps one copy of each."""
    await run_stories(api, names("dup", 2))
    rows = await db_fetch(
        database_url, "SELECT id, subject, envelope FROM outbox ORDER BY position"
    )
    assert len(rows) == 2 * EVENTS_PER_STORY
    # Crashed relay: the first half published, nothing marked.
    await publish_raw(nats_server.url, rows[: len(rows) // 2])

    async with in_process_relay(database_url, nats_server.url, batch_size=5) as relay:
        assert await drain(relay) == len(rows)
        await assert_stream_matches_outbox(database_url, nats_server.url)

        # Marks lost (say, a restored backup): everything goes out again, once on the stream.
        await db_fetch(database_url, "UPDATE outbox SET sent_at = NULL WHERE position % 3 <> 0")
        assert await drain(relay) == await db_fetch_count(database_url, "position % 3 <> 0")
        messages = await assert_stream_matches_outbox(database_url, nats_server.url)
        assert len(messages) == len(rows)


async def test_failed_publish_keeps_acknowledged_marks(
    api: RunningApi, database_url: str, nats_server: EmbeddedNats
) -> None:
    """A publish failing mid-batch: what JetStream acknowledged stays marked, the rest
    stays unsent (in order) for the next round, and nothing is lost or doubled."""
    await run_stories(api, names("mid", 1))
    # A row no stream captures makes JetStream refuse its publish ("no responders"),
    # deterministically, in the middle of a batch.
    poison = uuid.uuid4()
    await db_fetch(
        database_url,
        "INSERT INTO outbox (id, subject, envelope) "
        "SELECT $1, 'unrouted.poison', envelope FROM outbox ORDER BY position LIMIT 1",
        poison,
    )
    await run_stories(api, names("mid", 1))

    async with in_process_relay(database_url, nats_server.url, batch_size=100) as relay:
        with pytest.raises(NoStreamResponseError):
            await relay.relay_once()
        marked = await db_fetch(
            database_url, "SELECT id, sent_at IS NOT NULL AS sent FROM outbox ORDER BY position"
        )
        assert [row["sent"] for row in marked] == [True] * EVENTS_PER_STORY + [False] * (
            EVENTS_PER_STORY + 1
        )
        # Publishing is pipelined, so the events after the refused one may already be on
        # the stream; they stay unmarked until the refused one is, and their copies are
        # dropped by Nats-Msg-Id when they are published again.
        stored = await read_stream(nats_server.url)
        assert len(stored) >= EVENTS_PER_STORY
        assert str(poison) not in {m.msg_id for m in stored}

        # The failure dropped the connection; the next round reconnects and is blocked
        # by the same row, not past it: order is kept.
        with pytest.raises(NoStreamResponseError):
            await relay.relay_once()
        await db_fetch(database_url, "DELETE FROM outbox WHERE id = $1", poison)
        assert await drain(relay) == EVENTS_PER_STORY
        await assert_stream_matches_outbox(database_url, nats_server.url)


async def test_racing_relays_publish_each_event_once_in_node_order(
    api: RunningApi, database_url: str, nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """Two relay processes and an in-process relay against one outbox, while eight
    nodes change concurrently: each event once, every node's events in outbox order."""
    url = nats_server.url
    with (
        relay_process(database_url, url, tmp_path / "relay-a.log"),
        relay_process(database_url, url, tmp_path / "relay-b.log"),
    ):
        async with in_process_relay(database_url, url, batch_size=3) as third:
            stop = asyncio.Event()
            running = asyncio.create_task(third.run(stop, poll_interval_s=0.02))
            node_ids = await run_stories(api, names("race", 8))
            await run_stories(api, names("race2", 8))
            await wait_all_sent(database_url)
            stop.set()
            await asyncio.wait_for(running, 5)
        messages = await assert_stream_matches_outbox(database_url, url)
    assert len(messages) == 16 * EVENTS_PER_STORY
    seen_nodes = {m.subject.split(".")[3] for m in messages if ".node." in m.subject}
    assert set(node_ids) <= seen_nodes
    for name in ("relay-a.log", "relay-b.log"):
        assert "Traceback" not in (tmp_path / name).read_text()


async def test_a_commit_wakes_an_idle_relay(
    api: RunningApi, database_url: str, nats_server: EmbeddedNats
) -> None:
    """LISTEN/NOTIFY: with a one-minute poll, an event still reaches the stream at once."""
    async with in_process_relay(database_url, nats_server.url) as relay:
        stop = asyncio.Event()
        async with listening(database_url, OUTBOX_CHANNEL) as wake:
            running = asyncio.create_task(relay.run(stop, poll_interval_s=60, wake=wake))
            await asyncio.sleep(0.5)  # idle now, in its one-minute wait
            started = time.monotonic()
            await run_stories(api, names("wake", 1))
            await wait_all_sent(database_url, timeout_s=5)
            elapsed = time.monotonic() - started
            stop.set()
            await asyncio.wait_for(running, 5)
    assert elapsed < 5  # not the minute
    await assert_stream_matches_outbox(database_url, nats_server.url)


async def test_relay_stops_promptly_while_broker_is_down(
    database_url: str, nats_server: EmbeddedNats
) -> None:
    url = nats_server.url
    await asyncio.to_thread(nats_server.stop)
    async with in_process_relay(database_url, url) as relay:
        stop = asyncio.Event()
        running = asyncio.create_task(relay.run(stop, poll_interval_s=0.05))
        await asyncio.sleep(1.0)  # a window of failing connects it must outlive: no wait
        assert not running.done()
        started = time.monotonic()
        stop.set()
        await asyncio.wait_for(running, 5)
        assert time.monotonic() - started < 2.5


async def test_stream_declaration_is_idempotent_and_updates(nats_url: str) -> None:
    tag = secrets.token_hex(4)
    spec = StreamSpec(
        name=f"TEST_DECLARE_{tag}",
        subjects=[f"test.declare.{tag}.>"],
        duplicate_window_s=120.0,
        max_age_s=3600.0,
    )
    nc = await nats.connect(nats_url, allow_reconnect=False)
    try:
        js = nc.jetstream()
        # Publishers starting together: all succeed, one stream.
        infos = await asyncio.gather(*(declare(js, spec) for _ in range(5)))
        assert {info.config.name for info in infos} == {spec.name}
        await js.publish(f"test.declare.{tag}.a", b"kept")
        again = await declare(js, spec)
        assert again.config.duplicate_window == 120.0
        assert again.config.max_age == 3600.0
        assert again.state.messages == 1  # re-declaring never recreates

        changed = StreamSpec(
            name=spec.name,
            subjects=[*spec.subjects, f"test.declare2.{tag}.>"],
            duplicate_window_s=60.0,
            max_age_s=7200.0,
        )
        updated = await declare(js, changed)
        info = await js.stream_info(spec.name)
        for current in (updated.config, info.config):
            assert current.duplicate_window == 60.0
            assert current.max_age == 7200.0
            assert current.subjects == changed.subjects
        assert info.state.messages == 1

        # The production stream is declared the same way, and says what it promises.
        events = events_stream().config()
        assert events.subjects == ["modelforge.v1.>"]
        assert events.duplicate_window == 120.0
    finally:
        with suppress(NotFoundError):
            await nc.jetstream().delete_stream(spec.name)
        await nc.close()
