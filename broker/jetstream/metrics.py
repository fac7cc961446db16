"""Prometheus metrics for a worker process, registered in a registry the caller owns.

dramatiq's own Prometheus middleware uses the global default registry and forks an HTTP
server; the worker entry point instead exposes the registry passed here however it likes.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import dramatiq
from dramatiq.broker import MessageProxy
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from broker.jetstream.broker import JetStreamBroker
from broker.jetstream.dead_letters import Reason

logger = logging.getLogger(__name__)


class JetStreamMetrics(dramatiq.Middleware):
    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        lag_refresh_s: float = 15.0,
        prefix: str = "modelforge",
    ) -> None:
        by_actor = ["queue", "actor"]
        self.processed = Counter(
            f"{prefix}_messages_processed",
            "Messages whose actor finished without an exception.",
            by_actor,
            registry=registry,
        )
        self.failed = Counter(
            f"{prefix}_messages_failed",
            "Actor runs that raised (each retry counts) or were skipped as failed.",
            by_actor,
            registry=registry,
        )
        self.redelivered = Counter(
            f"{prefix}_messages_redelivered",
            "Messages handed to an actor again after an unsettled earlier delivery "
            "(worker died, or shut down and requeued it).",
            ["queue"],
            registry=registry,
        )
        self.dead_lettered = Counter(
            f"{prefix}_messages_dead_lettered",
            "Messages moved to the dead-letter stream.",
            ["queue", "reason"],
            registry=registry,
        )
        self.duration = Histogram(
            f"{prefix}_message_duration_seconds",
            "Actor run time.",
            by_actor,
            registry=registry,
        )
        self.pending = Gauge(
            f"{prefix}_consumer_pending",
            "Messages in the queue not yet delivered to any worker (consumer num_pending).",
            ["queue"],
            registry=registry,
        )
        self.ack_pending = Gauge(
            f"{prefix}_consumer_ack_pending",
            "Messages delivered and not yet acked, across all workers, including delayed "
            "messages waiting for their ETA (consumer num_ack_pending).",
            ["queue"],
            registry=registry,
        )
        self.in_flight = Gauge(
            f"{prefix}_worker_in_flight",
            "Messages this process holds unsettled.",
            ["queue"],
            registry=registry,
        )
        self._lag_refresh_s = lag_refresh_s
        self._started: dict[str, float] = {}
        self._poller: _LagPoller | None = None

    # -- message hooks (worker threads) -----------------------------------------------

    def before_process_message(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        self._started[message.message_id] = time.monotonic()
        if getattr(message, "redelivered", False):
            self.redelivered.labels(message.queue_name).inc()

    def after_process_message(
        self,
        broker: dramatiq.Broker,
        message: MessageProxy,
        *,
        result: Any | None = None,
        exception: BaseException | None = None,
    ) -> None:
        labels = (message.queue_name, message.actor_name)
        started = self._started.pop(message.message_id, None)
        if started is not None:
            self.duration.labels(*labels).observe(time.monotonic() - started)
        if exception is None:
            self.processed.labels(*labels).inc()
        else:
            self.failed.labels(*labels).inc()

    def after_skip_message(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        self._started.pop(message.message_id, None)
        if message.failed:
            self.failed.labels(message.queue_name, message.actor_name).inc()

    # -- JetStreamBroker hook (broker loop thread: must not block) ---------------------

    def after_dead_letter(self, broker: dramatiq.Broker, queue_name: str, reason: Reason) -> None:
        self.dead_lettered.labels(queue_name, reason.value).inc()

    # -- lag polling -----------------------------------------------------------------

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        self._poller = _LagPoller(broker, self, self._lag_refresh_s)
        self._poller.start()

    def before_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        if self._poller is not None:
            self._poller.stop()
            self._poller = None

    def refresh(self, broker: dramatiq.Broker) -> None:
        """Read consumer info for every declared queue (also callable directly)."""
        if not isinstance(broker, JetStreamBroker):
            return
        for queue_name in sorted(broker.get_declared_queues()):
            info = broker.consumer_info(queue_name)
            self.pending.labels(queue_name).set(info.num_pending or 0)
            self.ack_pending.labels(queue_name).set(info.num_ack_pending or 0)
            self.in_flight.labels(queue_name).set(broker.in_flight(queue_name))


class _LagPoller(threading.Thread):
    def __init__(self, broker: dramatiq.Broker, metrics: JetStreamMetrics, every_s: float) -> None:
        super().__init__(name="jetstream-lag-poller", daemon=True)
        self._broker = broker
        self._metrics = metrics
        self._every_s = every_s
        self._stopped = threading.Event()

    def run(self) -> None:
        while not self._stopped.is_set():
            try:
                self._metrics.refresh(self._broker)
            except Exception as exc:  # NATS away: keep the last values, try again later
                logger.warning("consumer lag refresh failed: %s", exc)
            self._stopped.wait(self._every_s)

    def stop(self) -> None:
        self._stopped.set()
        self.join(self._every_s + 1.0)
