"""The outbox relay tests' tools (tests/test_outbox_relay.py): the stream read back and
checked against the outbox, a node story that writes a known set of events through the
real API, and relays as a process or in this one."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import nats
from nats.aio.client import Client as NatsClient

from broker.streams import EVENTS_STREAM, declare, events_stream
from schemas.events import EVENT_SOURCE, CloudEvent, EventType
from store.engine import make_engine, make_sessionmaker
from tests.api_server import RunningApi
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
