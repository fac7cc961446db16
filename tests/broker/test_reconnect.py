"""The broker outlives a nats-server restart (same port, same JetStream store)."""

from __future__ import annotations

import asyncio
import time

from tests.broker.actors import declare_test_actors
from tests.broker.conftest import free_port, running_worker, start_server, stop_process

QUEUE = "default"


def test_worker_survives_server_restart(nats_server, settings, make_broker, effects, tmp_path):
    # A private server: restarting the shared one would disturb nothing here, but
    # keeps this test independent of test order.
    port = free_port()
    proc = start_server(nats_server.binary, tmp_path, port)
    try:
        settings = settings.model_copy(update={"nats_url": f"nats://127.0.0.1:{port}"})
        broker = make_broker(settings)
        actors = declare_test_actors(broker, effects)
        with running_worker(broker):
            actors.record.send("before")
            broker.join(QUEUE, timeout=10_000)

            stop_process(proc)
            time.sleep(0.5)  # the worker's fetches now fail; it must keep trying
            proc = start_server(nats_server.binary, tmp_path, port)

            # Async callers publish without blocking their loop; it waits for the
            # reconnect (and the publish is deduplicated if an attempt got through).
            message = actors.record.message("after")
            asyncio.run(broker.enqueue_async(message))
            effects.wait_for(
                lambda e: sum(x.kind == "done" for x in e) >= 2, 15, "run after restart"
            )
            broker.join(QUEUE, timeout=10_000)
        assert effects.counts("done") == {"before": 1, "after": 1}
    finally:
        stop_process(proc)
