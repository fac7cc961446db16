"""A durable consumer of ModelForge node events, to copy into your own service.

    python ops/examples/node_events_consumer.py --nats-url nats://127.0.0.1:4222 \
        --name gpu-inventory-sync --subject 'modelforge.v1.node.*.gpu.>'

What it shows:
* a *durable* pull consumer: it remembers its position across restarts, and several
  copies of this process with the same --name share the work;
* ack after your side effect commits, so a crash redelivers instead of losing;
* idempotency by CloudEvent id: delivery is at least once (see docs/events.md);
* per-node order is preserved by the stream; keep it by handling one node's events in
  sequence (here: one message at a time).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from typing import Any

import nats
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

STREAM = "MODELFORGE_EVENTS"


class SeenEvents:
    """Replace with a table in your database: insert the id in the same transaction
    as your side effect, and skip events whose id is already there."""

    def __init__(self) -> None:
        self._ids: set[str] = set()

    def first_time(self, event_id: str) -> bool:
        if event_id in self._ids:
            return False
        self._ids.add(event_id)
        return True


def handle(event: dict[str, Any]) -> None:
    """Your side effect. Raise to have the event redelivered later."""
    data = event["data"]
    print(
        f"{event['time']} {event['type']} node={event.get('nodeid')} {json.dumps(data)}",
        flush=True,
    )


async def consume(nats_url: str, name: str, subject: str, stop: asyncio.Event) -> None:
    nc = await nats.connect(nats_url, max_reconnect_attempts=-1)
    js = nc.jetstream()
    subscription = await js.pull_subscribe(
        subject,
        durable=name,
        stream=STREAM,
        config=ConsumerConfig(
            ack_policy=AckPolicy.EXPLICIT,
            # A new consumer starts from the beginning of the stream (full replay).
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=30,
            max_ack_pending=1,
        ),
    )
    seen = SeenEvents()
    try:
        while not stop.is_set():
            try:
                messages = await subscription.fetch(1, timeout=2)
            except NatsTimeoutError:
                continue
            for message in messages:
                event = json.loads(message.data)
                try:
                    if seen.first_time(event["id"]):
                        handle(event)
                except Exception:
                    # Back off and let the server redeliver it.
                    await message.nak(delay=5)
                    continue
                await message.ack()
    finally:
        # Unacked messages simply return to the server after ack_wait.
        await nc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nats-url", default="nats://127.0.0.1:4222")
    parser.add_argument("--name", default="example-node-events")
    parser.add_argument("--subject", default="modelforge.v1.node.>")
    args = parser.parse_args()

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await consume(args.nats_url, args.name, args.subject, stop)

    asyncio.run(run())


if __name__ == "__main__":
    main()
