"""Schedules periodic work through the broker, exactly once per period across all workers.

Every worker process publishes the sweep message of the current period with a message
id derived from the period number; JetStream's Nats-Msg-Id dedupe keeps one. So the
schedule needs no leader, survives any worker dying, and adding workers adds no sweeps.
"""

from __future__ import annotations

import logging
import threading
import time

import dramatiq
from dramatiq.errors import ConnectionError as BrokerConnectionError

logger = logging.getLogger("modelforge.workers.ticker")


class PeriodicTicker:
    def __init__(
        self, broker: dramatiq.Broker, actor: dramatiq.Actor[..., object], period_s: float
    ) -> None:
        self._broker = broker
        self._actor = actor
        self._period_s = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"ticker-{actor.actor_name}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _message(self, bucket: int) -> dramatiq.Message[object]:
        return dramatiq.Message(
            queue_name=self._actor.queue_name,
            actor_name=self._actor.actor_name,
            args=(bucket,),
            kwargs={},
            options={},
            message_id=f"{self._actor.actor_name}-{bucket}",
        )

    def _run(self) -> None:
        last = -1
        while not self._stop.is_set():
            bucket = int(time.time() // self._period_s)
            if bucket != last:
                try:
                    self._broker.enqueue(self._message(bucket))
                    last = bucket
                except BrokerConnectionError:
                    logger.warning(
                        "could not schedule %s; NATS unreachable", self._actor.actor_name
                    )
            # Wake at the next period boundary (a little after, to land in the new bucket).
            wait = self._period_s - (time.time() % self._period_s) + 0.005
            self._stop.wait(wait)
