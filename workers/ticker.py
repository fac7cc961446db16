"""Schedules periodic work through the broker, exactly once per period across all workers.

The schedule is data: a list of (actor, period) entries (workers/main.py). The liveness
sweep is one entry; lease expiry and the deployment reconciler will be more.

Every worker process publishes the sweep message of the current period with a message
id derived from the period number; JetStream's Nats-Msg-Id dedupe keeps one. So the
schedule needs no leader, survives any worker dying, and adding workers adds no sweeps.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import dramatiq
from dramatiq.errors import ConnectionError as BrokerConnectionError

logger = logging.getLogger("modelforge.workers.ticker")


@dataclass(frozen=True)
class Periodic:
    """One entry of the schedule: send `actor` its period number every `period_s`."""

    actor: dramatiq.Actor[..., object]
    period_s: float


class PeriodicTicker:
    """One thread for the whole schedule: it wakes at the next boundary of any entry."""

    def __init__(self, broker: dramatiq.Broker, schedule: Sequence[Periodic]) -> None:
        self._broker = broker
        self._schedule = list(schedule)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ticker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    @staticmethod
    def message(entry: Periodic, bucket: int) -> dramatiq.Message[object]:
        return dramatiq.Message(
            queue_name=entry.actor.queue_name,
            actor_name=entry.actor.actor_name,
            args=(bucket,),
            kwargs={},
            options={},
            # The same id from every worker in a period: JetStream keeps one.
            message_id=f"{entry.actor.actor_name}-{bucket}",
        )

    def _run(self) -> None:
        last = {entry.actor.actor_name: -1 for entry in self._schedule}
        while not self._stop.is_set():
            for entry in self._schedule:
                bucket = int(time.time() // entry.period_s)
                if bucket == last[entry.actor.actor_name]:
                    continue
                try:
                    self._broker.enqueue(self.message(entry, bucket))
                    last[entry.actor.actor_name] = bucket
                except BrokerConnectionError:
                    logger.warning(
                        "could not schedule %s; NATS unreachable", entry.actor.actor_name
                    )
            # Wake at the next boundary of any entry (a little after, to land in it).
            now = time.time()
            wait = min(e.period_s - (now % e.period_s) for e in self._schedule) + 0.005
            self._stop.wait(wait)
