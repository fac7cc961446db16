"""A worker process for the broker tests: `python -m tests.broker.worker_main`.

Builds the broker from MODELFORGE_* (BrokerSettings), declares the test actors, runs a
dramatiq Worker with 2 threads and, like dramatiq's CLI, stops it gracefully on SIGTERM
(Worker.stop: in-flight actors finish and are acked, prefetched messages are requeued).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from pathlib import Path

import dramatiq

from broker.jetstream import BrokerSettings, build_broker
from tests.broker.actors import declare_test_actors
from tests.broker.effects import EffectLog

EFFECTS_ENV = "MF_TEST_EFFECTS"


def main() -> int:
    logging.basicConfig(
        level=logging.INFO, format=f"[worker {os.getpid()}] %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("broker.jetstream").setLevel(logging.DEBUG)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    effects = EffectLog(Path(os.environ[EFFECTS_ENV]))
    broker = build_broker(BrokerSettings(), client_name=f"test-worker-{os.getpid()}")
    broker.emit_after("process_boot")
    declare_test_actors(broker, effects)
    worker = dramatiq.Worker(broker, worker_threads=2, worker_timeout=200)
    worker.start()
    effects.write("ready", "-")
    stop.wait()
    worker.stop(timeout=30_000)
    broker.close()
    effects.write("exited", "-")
    return 0


if __name__ == "__main__":
    sys.exit(main())
