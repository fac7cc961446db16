"""The invoke relay of one API process: leased invokes out to the runtime workers' held
channels, and their answers back to the process that holds the client.

Three parties, often fewer:
* the **gateway** process holding the client's request (A) arms a `Pending` invoke with
  a lease (id and epoch) and delivers it to the node;
* the process holding the node's **runtime channel** (B) pushes it down that channel
  (api/agent/runtime_channel.py); the lease rides with it, so the node needs no claim;
* the process the runtime worker **streams the answer** to (C, api/agent/invokes.py)
  checks the lease with A first, then forwards the answer's chunks.

Where A is B or C (one API process, or a lucky balancer), everything stays in memory.
Otherwise A reaches B with a NATS request on the node's subject (only a process that
holds the node's channel subscribes to it, so "no responders" says at once that the
node is not connected), and C reaches A on A's own subject: core NATS, never the
events stream (schemas/protocol.py: INVOKE_SUBJECTS). Nothing here touches PostgreSQL:
an invoke has no durable record on the hot path (invokes are metered, api/metrics.py).

Fencing: every attempt of an invoke has its own epoch (1, then 2 on another deployment
...). Only the current epoch's stream is taken; a holder of an older one (the gateway
gave up on it and retried elsewhere) is refused with 409, and frames that still arrive
under it are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import struct
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from broker.jetstream.settings import nats_servers
from schemas.gateway import Invoke, InvokeCancel
from schemas.protocol import INVOKE_SUBJECTS, invoke_node_subject, invoke_reply_subject

logger = logging.getLogger("modelforge.api.gateway")

# On a node's subject: an invoke (a request: the answer says whether a channel took
# it) or a cancel. On a gateway's subject: a stream's open (a request: the answer is
# the verdict), its data and its end, each after the epoch it is under.
_INVOKE, _CANCEL = b"i", b"c"
_OPEN, _DATA, _END = b"o", b"d", b"e"
_EPOCH = struct.Struct(">Q")
# Events a runtime channel may hold unread before it is taken for a slow consumer.
CHANNEL_QUEUE = 256


class Verdict(StrEnum):
    OK = "ok"
    NOT_FOUND = "not_found"
    NOT_OWNED = "not_owned"
    STALE = "stale"


EVENT_STREAM = "text/event-stream"
JSON = "application/json"


@dataclass(frozen=True)
class Opened:
    status: int
    # What the gateway serves the answer as (answer_media_type), never the node's word.
    content_type: str


def answer_media_type(declared: str | None) -> str:
    """The media type a node's answer is served as: events for a stream, JSON for
    anything else. The node is outside the trust boundary: an answer it labelled as a
    page or an image would run as one on the API's origin, the dashboard's."""
    media = (declared or "").split(";", 1)[0].strip().lower()
    return EVENT_STREAM if media == EVENT_STREAM else JSON


@dataclass(frozen=True)
class Ended:
    ok: bool
    reason: str = ""


Frame = Opened | bytes | Ended


class Pending:
    """One invoke the gateway waits on: the lease of its current attempt, and the frames
    of that attempt's answer."""

    def __init__(self, invoke_id: uuid.UUID, node_id: uuid.UUID, deployment_id: uuid.UUID):
        self.invoke_id = invoke_id
        self.node_id = node_id
        self.deployment_id = deployment_id
        self.lease_id = uuid.uuid4()
        self.epoch = 0
        self.frames: asyncio.Queue[Frame] = asyncio.Queue()

    def arm(self, node_id: uuid.UUID, deployment_id: uuid.UUID) -> tuple[uuid.UUID, int]:
        """The next attempt: a new lease, and nothing left over from the last one."""
        self.node_id = node_id
        self.deployment_id = deployment_id
        self.lease_id = uuid.uuid4()
        self.epoch += 1
        self.frames = asyncio.Queue()
        return self.lease_id, self.epoch

    def verdict(self, node_id: uuid.UUID, lease_id: uuid.UUID, epoch: int) -> Verdict:
        if node_id != self.node_id:
            return Verdict.NOT_OWNED
        if lease_id != self.lease_id or epoch != self.epoch:
            return Verdict.STALE
        return Verdict.OK

    def take(self, epoch: int, frame: Frame) -> None:
        if epoch == self.epoch:
            self.frames.put_nowait(frame)


class Sink(Protocol):
    """Where an answer stream's chunks go (the gateway's Pending, here or elsewhere)."""

    async def data(self, chunk: bytes) -> None: ...
    async def end(self, ended: Ended) -> None: ...


class _LocalSink:
    def __init__(self, pending: Pending, epoch: int) -> None:
        self.pending = pending
        self.epoch = epoch

    async def data(self, chunk: bytes) -> None:
        self.pending.take(self.epoch, chunk)

    async def end(self, ended: Ended) -> None:
        self.pending.take(self.epoch, ended)


class _RemoteSink:
    def __init__(self, nc: NatsClient, subject: str, epoch: int) -> None:
        self.nc = nc
        self.subject = subject
        self.prefix = _EPOCH.pack(epoch)

    async def data(self, chunk: bytes) -> None:
        await self.nc.publish(self.subject, _DATA + self.prefix + chunk)

    async def end(self, ended: Ended) -> None:
        body = json.dumps({"ok": ended.ok, "reason": ended.reason}).encode()
        await self.nc.publish(self.subject, _END + self.prefix + body)


class InvokeRelay:
    def __init__(self, nats_url: str, *, delivery_timeout_s: float) -> None:
        # This process's gateway id: where answers for its clients are sent.
        self.id = uuid.uuid4().hex
        self.delivery_timeout_s = delivery_timeout_s
        self._nats_url = nats_url
        self._nc: NatsClient | None = None
        self._pending: dict[uuid.UUID, Pending] = {}
        self._channels: dict[uuid.UUID, set[asyncio.Queue[tuple[str, str]]]] = {}
        self._node_subs: dict[uuid.UUID, Subscription] = {}
        # Invokes this process has in flight, per deployment (the routing's own view).
        self.in_flight: Counter[uuid.UUID] = Counter()
        # Writes done off the hot path (a cooldown), kept until they end.
        self._background: set[asyncio.Task[None]] = set()

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ------------------------------------------------------------------ connection

    @property
    def connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

    async def run(self, stop: asyncio.Event) -> None:
        """Connect (retrying while NATS is down), subscribe, hold until `stop`. nats-py
        reconnects and re-subscribes by itself once connected."""
        delay = 0.5
        while not stop.is_set():
            try:
                nc = await asyncio.wait_for(
                    nats.connect(
                        servers=nats_servers(self._nats_url),
                        name="modelforge-api-invokes",
                        connect_timeout=2,
                        max_reconnect_attempts=-1,
                        reconnect_time_wait=0.5,
                        error_cb=_quiet,
                    ),
                    5,
                )
            except (OSError, TimeoutError, nats.errors.Error) as exc:
                logger.debug("invokes: NATS unavailable (%s)", type(exc).__name__)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                delay = min(delay * 2, 10.0)
                continue
            self._nc = nc
            await nc.subscribe(f"{INVOKE_SUBJECTS}.gateway.{self.id}.*", cb=self._on_reply)
            for node_id in list(self._channels):
                await self._subscribe_node(node_id)
            logger.info("invoke relay on NATS (gateway %s)", self.id)
            await stop.wait()
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.close()
            self._nc = None

    # ------------------------------------------------------------------ runtime channels

    @contextlib.asynccontextmanager
    async def channel(self, node_id: uuid.UUID) -> AsyncIterator[asyncio.Queue[tuple[str, str]]]:
        """A node's runtime channel: (event, data) pairs to send down it."""
        queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue(CHANNEL_QUEUE)
        first = node_id not in self._channels
        self._channels.setdefault(node_id, set()).add(queue)
        if first:
            await self._subscribe_node(node_id)
        try:
            yield queue
        finally:
            queues = self._channels.get(node_id)
            if queues is not None:
                queues.discard(queue)
                if not queues:
                    del self._channels[node_id]
                    sub = self._node_subs.pop(node_id, None)
                    if sub is not None:
                        with contextlib.suppress(Exception):
                            await sub.unsubscribe()

    async def _subscribe_node(self, node_id: uuid.UUID) -> None:
        if self._nc is None or node_id in self._node_subs:
            return
        try:
            self._node_subs[node_id] = await self._nc.subscribe(
                invoke_node_subject(node_id), cb=self._on_node_message
            )
        except nats.errors.Error:
            logger.warning("invokes: could not subscribe for node %s", node_id)

    def _push(self, node_id: uuid.UUID, event: str, data: str) -> bool:
        taken = False
        for queue in self._channels.get(node_id, ()):
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait((event, data))
                taken = True
        return taken

    async def _on_node_message(self, msg: Msg) -> None:
        node_id = uuid.UUID(msg.subject.rsplit(".", 1)[-1])
        kind, body = msg.data[:1], msg.data[1:].decode()
        if kind == _INVOKE:
            taken = self._push(node_id, "invoke", body)
            if msg.reply:
                await msg.respond(b"1" if taken else b"0")
        elif kind == _CANCEL:
            self._push(node_id, "cancel", body)

    # ------------------------------------------------------------------ the gateway's side

    def expect(self, invoke_id: uuid.UUID, node_id: uuid.UUID, deployment_id: uuid.UUID) -> Pending:
        pending = Pending(invoke_id, node_id, deployment_id)
        self._pending[invoke_id] = pending
        return pending

    def forget(self, pending: Pending) -> None:
        self._pending.pop(pending.invoke_id, None)

    async def deliver(self, node_id: uuid.UUID, invoke: Invoke) -> bool:
        """Hand the invoke to the node's runtime channel; False if no channel took it."""
        data = invoke.model_dump_json()
        if node_id in self._channels:
            return self._push(node_id, "invoke", data)
        if self._nc is None or not self._nc.is_connected:
            return False
        try:
            answer = await self._nc.request(
                invoke_node_subject(node_id),
                _INVOKE + data.encode(),
                timeout=self.delivery_timeout_s,
            )
        except (TimeoutError, nats.errors.Error):
            return False  # no responders: no API process holds the node's channel
        return answer.data == b"1"

    async def cancel(self, node_id: uuid.UUID, invoke_id: uuid.UUID) -> None:
        """The invoke's client left (or the gateway gave up on this attempt)."""
        data = InvokeCancel(invoke_id=invoke_id).model_dump_json()
        if node_id in self._channels:
            self._push(node_id, "cancel", data)
            return
        if self._nc is not None and self._nc.is_connected:
            with contextlib.suppress(nats.errors.Error):
                await self._nc.publish(invoke_node_subject(node_id), _CANCEL + data.encode())

    async def _on_reply(self, msg: Msg) -> None:
        invoke_id = uuid.UUID(msg.subject.rsplit(".", 1)[-1])
        pending = self._pending.get(invoke_id)
        kind = msg.data[:1]
        if kind == _OPEN:
            opened = json.loads(msg.data[1:])
            verdict = Verdict.NOT_FOUND
            if pending is not None:
                verdict = pending.verdict(
                    uuid.UUID(opened["node_id"]), uuid.UUID(opened["lease_id"]), opened["epoch"]
                )
                if verdict == Verdict.OK:
                    pending.take(opened["epoch"], Opened(opened["status"], opened["content_type"]))
            if msg.reply:
                await msg.respond(verdict.value.encode())
            return
        if pending is None or len(msg.data) < 1 + _EPOCH.size:
            return
        (epoch,) = _EPOCH.unpack_from(msg.data, 1)
        rest = msg.data[1 + _EPOCH.size :]
        if kind == _DATA:
            pending.take(epoch, rest)
        elif kind == _END:
            ended = json.loads(rest)
            pending.take(epoch, Ended(bool(ended.get("ok")), str(ended.get("reason", ""))))

    # ------------------------------------------------------------------ the answer's side

    async def open_stream(
        self,
        *,
        node_id: uuid.UUID,
        invoke_id: uuid.UUID,
        gateway: str,
        lease_id: uuid.UUID,
        epoch: int,
        opened: Opened,
    ) -> tuple[Verdict, Sink | None]:
        """Where a runtime worker's answer stream goes, once the invoke's gateway
        accepted its lease; the verdict otherwise."""
        if gateway == self.id:
            pending = self._pending.get(invoke_id)
            if pending is None:
                return Verdict.NOT_FOUND, None
            verdict = pending.verdict(node_id, lease_id, epoch)
            if verdict != Verdict.OK:
                return verdict, None
            pending.take(epoch, opened)
            return verdict, _LocalSink(pending, epoch)
        if self._nc is None or not self._nc.is_connected:
            return Verdict.NOT_FOUND, None
        subject = invoke_reply_subject(gateway, invoke_id)
        request = {
            "node_id": str(node_id),
            "lease_id": str(lease_id),
            "epoch": epoch,
            "status": opened.status,
            "content_type": opened.content_type,
        }
        try:
            answer = await self._nc.request(
                subject, _OPEN + json.dumps(request).encode(), timeout=self.delivery_timeout_s
            )
        except (TimeoutError, nats.errors.Error):
            return Verdict.NOT_FOUND, None  # that gateway process is gone
        verdict = Verdict(answer.data.decode())
        if verdict != Verdict.OK:
            return verdict, None
        return verdict, _RemoteSink(self._nc, subject, epoch)


async def _quiet(error: Exception) -> None:
    # nats-py logs every reconnect attempt's error itself; one line at debug is enough
    # (the API serves on while NATS is down: cross-process invokes just go unanswered).
    logger.debug("invokes: NATS %s", type(error).__name__)


@contextlib.asynccontextmanager
async def invoke_relay(nats_url: str, *, delivery_timeout_s: float) -> AsyncIterator[InvokeRelay]:
    relay = InvokeRelay(nats_url, delivery_timeout_s=delivery_timeout_s)
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    try:
        yield relay
    finally:
        stop.set()
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(task, 3)
