"""The outbox relay against real PostgreSQL, a real nats-server and the real API.

Every event written to the outbox reaches the JetStream stream exactly once, in
per-node order, as CloudEvents JSON with Nats-Msg-Id = event id, across broker
outages, crashed relays and relays racing each other. The API is driven over HTTP;
the database and the stream are read directly only to verify.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.js.errors import NoStreamResponseError, NotFoundError

from broker.streams import EVENTS_STREAM, StreamSpec, declare, events_stream
from schemas.events import EVENT_SOURCE, CloudEvent, EventType
from stack.embedded_nats import EmbeddedNats
from store.engine import make_engine, make_sessionmaker
from store.notify import OUTBOX_CHANNEL, listening
from tests.api_server import ApiFactory, RunningApi
from tests.flows import ENROLL, HEARTBEAT, INVENTORY, TOKENS, enroll_body, gpu, heartbeat_body
from tests.flows import inventory_body as flows_inventory_body
from tests.pipeline import reconcile_now
from tests.services import db_fetch
from workers.relay import OutboxRelay, connect_nats

ROOT = Path(__file__).resolve().parent.parent
# Events one node_story() produces: token.created, node.enrolled, 2 x gpu.added,
# node.agent.changed, node.updated, gpu.changed, gpu.missing, gpu.returned.
# 10 changes, and 3 node.inventory.accepted.
EVENTS_PER_STORY = 13


@pytest.fixture
def api(api_factory: ApiFactory) -> RunningApi:
    """Without the test pipeline: these tests run the relay themselves."""
    return api_factory(pipeline=False)


# --- database and stream ---------------------------------------------------------------


async def db_fetch_count(database_url: str, where: str) -> int:
    rows = await db_fetch(database_url, f"SELECT count(*) AS n FROM outbox WHERE {where}")  # noqa: S608
    return int(rows[0]["n"])


async def unsent(database_url: str) -> int:
    return await db_fetch_count(database_url, "sent_at IS NULL")


@dataclass(frozen=True)
class StreamMessage:
    seq: int
    subject: str
    msg_id: str | None
    data: bytes


async def read_stream(url: str, stream: str = EVENTS_STREAM) -> list[StreamMessage]:
    """Every message of the stream, by sequence, with the headers it was stored with."""
    nc = await nats.connect(url, allow_reconnect=False, connect_timeout=5)
    try:
        js = nc.jetstream(timeout=10)
        state = (await js.stream_info(stream)).state
        messages = []
        for seq in range(state.first_seq, state.last_seq + 1):
            raw = await js.get_msg(stream, seq)
            headers = raw.headers or {}
            assert raw.subject is not None and raw.data is not None
            messages.append(StreamMessage(seq, raw.subject, headers.get("Nats-Msg-Id"), raw.data))
        assert len(messages) == state.messages
        return messages
    finally:
        await nc.close()


async def wait_until(
    check: Callable[[], Awaitable[bool]], timeout_s: float, what: str, poll_s: float = 0.1
) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(poll_s)


async def wait_all_sent(database_url: str, timeout_s: float = 20.0) -> None:
    async def done() -> bool:
        return await unsent(database_url) == 0

    await wait_until(done, timeout_s, "every outbox row to be marked sent")


async def assert_stream_matches_outbox(database_url: str, url: str) -> list[StreamMessage]:
    """Exactly once, per-target order, CloudEvents shape; returns the stream."""
    rows = await db_fetch(
        database_url, "SELECT position, id, subject, envelope, sent_at FROM outbox ORDER BY 1"
    )
    assert rows, "the scenario produced no events"
    assert all(row["sent_at"] is not None for row in rows)
    messages = await read_stream(url)

    # Exactly once: the multiset of stream ids is the set of outbox ids.
    counts = Counter(m.msg_id for m in messages)
    duplicated = {i: n for i, n in counts.items() if n > 1}
    assert not duplicated, f"events on the stream more than once: {duplicated}"
    outbox_ids = {str(row["id"]) for row in rows}
    assert set(counts) == outbox_ids, (
        f"missing from the stream: {len(outbox_ids - set(counts))}, "
        f"unknown on the stream: {len(set(counts) - outbox_ids)}"
    )

    # CloudEvents 1.0 JSON, identical to the outbox envelope, on its own subject.
    envelopes = {str(row["id"]): json.loads(row["envelope"]) for row in rows}
    for message in messages:
        event = CloudEvent.model_validate_json(message.data)
        assert str(event.id) == message.msg_id
        assert event.subject == message.subject
        assert event.specversion == "1.0"
        assert event.source == EVENT_SOURCE
        assert event.type.startswith("io.modelforge.") and event.type.endswith(".v1")
        assert event.datacontenttype == "application/json"
        assert json.loads(message.data) == envelopes[str(event.id)]
        _, _, kind, _, rest = message.subject.split(".", 4)
        assert event.type == EventType(f"{kind}.{rest}").cloudevent_type
        if message.subject.startswith("modelforge.v1.node."):
            assert str(event.nodeid) == message.subject.split(".")[3]

    # Per target (node or token), stream order is outbox position order.
    def by_target(pairs: list[tuple[str, str]]) -> dict[str, list[str]]:
        grouped: dict[str, list[str]] = defaultdict(list)
        for subject, event_id in pairs:
            grouped[".".join(subject.split(".")[2:4])].append(event_id)
        return grouped

    in_outbox = by_target([(row["subject"], str(row["id"])) for row in rows])
    on_stream = by_target([(m.subject, str(m.msg_id)) for m in messages])
    assert on_stream == in_outbox
    return messages


# --- the API: what operators and agents do ----------------------------------------------


def inventory(node_id: str, sequence: int, gpus: list[dict[str, Any]], host: str) -> dict[str, Any]:
    return flows_inventory_body(node_id, sequence, gpus=gpus, hostname=host)


async def node_story(client: httpx.AsyncClient, api: RunningApi, name: str) -> str:
    """One node's life, strictly sequential; EVENTS_PER_STORY events. Returns the node id."""
    response = await client.post(TOKENS, json={}, headers=api.admin_headers)
    assert response.status_code == 201, response.text
    response = await client.post(ENROLL, json=enroll_body(response.json()["secret"], name))
    assert response.status_code == 201, response.text
    node_id: str = response.json()["node_id"]
    auth = {"Authorization": f"Bearer {response.json()['credential']}"}
    first, second = gpu(0), gpu(1)
    upgraded = {**first, "driver_version": "575.1"}
    steps: list[tuple[str, str, dict[str, Any]]] = [
        # 2 x gpu.added
        ("PUT", INVENTORY, inventory(node_id, 1, [first, second], name)),
        # node.agent.changed, node.liveness.changed (first heartbeat: online)
        ("POST", HEARTBEAT, heartbeat_body(node_id, agent_version="1.1.0")),
        # node.updated (hostname), gpu.changed (driver), gpu.missing (the second GPU)
        ("PUT", INVENTORY, inventory(node_id, 2, [upgraded], f"{name}-renamed")),
        # gpu.returned
        ("PUT", INVENTORY, inventory(node_id, 3, [upgraded, second], f"{name}-renamed")),
    ]
    for method, path, body in steps:
        response = await client.request(method, path, json=body, headers=auth)
        assert response.status_code == 200, response.text
        if path == INVENTORY:
            # No workers here: reconcile as the consumer would, before the next step.
            await reconcile_now(api.settings.database_url, node_id)
    return node_id


async def run_stories(api: RunningApi, names: list[str]) -> list[str]:
    async with api.async_client() as client:
        return list(await asyncio.gather(*(node_story(client, api, n) for n in names)))


def names(prefix: str, count: int) -> list[str]:
    return [f"{prefix}-{i}-{secrets.token_hex(2)}" for i in range(count)]


# --- relays -----------------------------------------------------------------------------


@contextmanager
def relay_process(database_url: str, nats_url: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`python -m cli.main relay`, exactly as deployed; stopped with SIGTERM, which it
    must obey promptly and cleanly whatever state the broker is in."""
    env = {
        **os.environ,
        "MODELFORGE_DATABASE_URL": database_url,
        "MODELFORGE_NATS_URL": nats_url,
        "MODELFORGE_RELAY_POLL_INTERVAL_S": "0.05",
        "MODELFORGE_RELAY_BATCH_SIZE": "7",  # small batches: many rounds, many lock handovers
        "MODELFORGE_LOG_LEVEL": "INFO",
    }
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "relay"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield proc
        assert proc.poll() is None, f"relay died:\n{log.read_text()}"
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=10)
        took = time.monotonic() - started
        assert code == 0, f"relay exited {code}:\n{log.read_text()}"
        assert took < 5, f"relay took {took:.1f} s to stop"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@asynccontextmanager
async def in_process_relay(
    database_url: str, nats_url: str, **kwargs: Any
) -> AsyncIterator[OutboxRelay]:
    engine = make_engine(database_url, pool_size=2)
    relay = OutboxRelay(make_sessionmaker(engine), partial(connect_nats, nats_url), **kwargs)
    try:
        yield relay
    finally:
        await relay.close()
        await engine.dispose()


async def drain(relay: OutboxRelay) -> int:
    total = 0
    while count := await relay.relay_once():
        total += count
    return total


async def publish_raw(url: str, rows: list[asyncpg.Record]) -> None:
    """What a relay does before it crashes between publishing and marking."""
    nc: NatsClient = await nats.connect(url, allow_reconnect=False)
    try:
        js = nc.jetstream()
        await declare(js, events_stream())
        for row in rows:
            ack = await js.publish(
                row["subject"], row["envelope"].encode(), headers={"Nats-Msg-Id": str(row["id"])}
            )
            assert not ack.duplicate
    finally:
        await nc.close()


# --- tests ------------------------------------------------------------------------------


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
