"""A durable consumer of ModelForge node events, to copy into your own service.

    python ops/examples/node_events_consumer.py --name gpu-inventory-sync \
        --subject 'modelforge.v1.node.*.gpu.>' [--nats-url nats://...]

Without --nats-url it uses the NATS of the running `modelforge up`, from the stack file
it writes (`.modelforge/stack.json`, or under $MODELFORGE_DATA_DIR); never a default port,
where some other NATS may answer.

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
import os
import signal
from pathlib import Path
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


async def _quiet(exc: Exception) -> None:
    # nats-py prints a traceback for every failed attempt by default.
    pass


def handle(event: dict[str, Any]) -> None:
    """Your side effect. Raise to have the event redelivered later."""
    data = event["data"]
    print(
        f"{event['time']} {event['type']} node={event.get('nodeid')} {json.dumps(data)}",
        flush=True,
    )


async def consume(nats_url: str, name: str, subject: str, stop: asyncio.Event) -> None:
    # Bounded: with reconnects on, nats-py retries an unreachable first server forever.
    nc = await asyncio.wait_for(
        nats.connect(nats_url, max_reconnect_attempts=-1, error_cb=_quiet), timeout=10
    )
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


def stack_nats_url() -> str:
    """The NATS URL `modelforge up` wrote into its data dir; exits with one line if none."""
    path = Path(os.environ.get("MODELFORGE_DATA_DIR") or ".modelforge") / "stack.json"
    try:
        url: str = json.loads(path.read_text())["nats_url"]
    except (OSError, ValueError, KeyError):
        raise SystemExit(f"no NATS URL: pass --nats-url, or run `modelforge up` ({path})") from None
    return url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nats-url", help="default: the running `modelforge up`")
    parser.add_argument("--name", default="example-node-events")
    parser.add_argument("--subject", default="modelforge.v1.node.>")
    args = parser.parse_args()

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await consume(args.nats_url or stack_nats_url(), args.name, args.subject, stop)

    try:
        asyncio.run(run())
    except (OSError, TimeoutError, nats.errors.Error) as exc:
        raise SystemExit(f"cannot reach NATS: {type(exc).__name__}: {exc}") from None


if __name__ == "__main__":
    main()
