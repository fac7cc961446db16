"""Job notifications, relayed by the API: one NATS subscription per API process, fanned
out to the held requests of the nodes the jobs belong to.

The workers' relay publishes every job event to JetStream (`modelforge.v1.job.<id>.…`);
a plain core subscription on those subjects sees each one as it is published. The
envelope's `nodeid` names the node; `job.created` and `job.cancel_requested` are what a
node wants to hear about (claim now; stop now), with the job's kind (schemas/events.py:
JobEvent), so that only the node's loop for that kind claims. A notification is only a wake-up: it
carries no work, and a node that missed one (no channel open, NATS down, its queue full)
still finds the job on its next poll of `…/next`.

The subscription is kept by a background task that reconnects with backoff
(api/nats_subscription.py), so the API starts and serves agents while NATS is down;
channels then simply stay quiet.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Final

from nats.aio.msg import Msg

from api.nats_subscription import subscribe_forever
from schemas.events import SUBJECT_PREFIX, EventType

logger = logging.getLogger("modelforge.api.notifications")

SUBJECTS: Final = f"{SUBJECT_PREFIX}.job.>"
NOTIFIED: Final = frozenset({EventType.JOB_CREATED.value, EventType.JOB_CANCEL_REQUESTED.value})
# Per channel: wake-ups beyond this are dropped (one is enough to make the node claim).
QUEUE_SIZE: Final = 8


class NotificationHub:
    def __init__(self) -> None:
        self._channels: dict[uuid.UUID, set[asyncio.Queue[str]]] = {}
        # Set while NATS holds the subscription (api/nats_subscription.py).
        self._subscribed = asyncio.Event()
        self.delivered = 0

    @property
    def connected(self) -> bool:
        return self._subscribed.is_set()

    @property
    def open_channels(self) -> int:
        return sum(len(queues) for queues in self._channels.values())

    @contextlib.contextmanager
    def channel(self, node_id: uuid.UUID) -> Iterator[asyncio.Queue[str]]:
        queue: asyncio.Queue[str] = asyncio.Queue(QUEUE_SIZE)
        self._channels.setdefault(node_id, set()).add(queue)
        try:
            yield queue
        finally:
            queues = self._channels.get(node_id)
            if queues is not None:
                queues.discard(queue)
                if not queues:
                    del self._channels[node_id]

    def deliver(self, data: bytes) -> None:
        try:
            envelope = json.loads(data)
            action = envelope["action"]
            node_id = uuid.UUID(envelope["nodeid"])
        except (ValueError, KeyError, TypeError):
            return
        if action not in NOTIFIED:
            return
        carried = envelope.get("data")
        job = carried if isinstance(carried, dict) else {}
        # The kind lets the node wake only the loop that claims it (agent/jobs/wakeups.py).
        note = json.dumps(
            {"event": action, "job_id": job.get("job_id"), "kind": job.get("kind")},
            separators=(",", ":"),
        )
        for queue in self._channels.get(node_id, ()):
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(note)
                self.delivered += 1

    async def _on_message(self, message: Msg) -> None:
        self.deliver(message.data)

    async def run(self, nats_url: str, stop: asyncio.Event) -> None:
        """Hold the subscription until `stop`, reconnecting with backoff."""
        await subscribe_forever(
            nats_url,
            SUBJECTS,
            self._on_message,
            ready=self._subscribed,
            stop=stop,
            client_name="modelforge-api-notifications",
            label="job notifications",
            logger=logger,
            announce=True,
        )


@contextlib.asynccontextmanager
async def notification_hub(nats_url: str) -> AsyncIterator[NotificationHub]:
    hub = NotificationHub()
    stop = asyncio.Event()
    task = asyncio.create_task(hub.run(nats_url, stop))
    try:
        yield hub
    finally:
        stop.set()
        # A connect attempt in progress (NATS down) is not waited out.
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(task, 2)
