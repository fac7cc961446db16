"""Several worker processes (tests/broker/worker_main.py) sharing one queue's consumer."""

from __future__ import annotations

import signal
import time

from tests.broker.actors import HOLD_ENV, declare_test_actors
from tests.broker.conftest import wait_ready

QUEUE = "default"


def test_killed_worker_message_is_redelivered_and_processed_once(
    settings, make_broker, effects, spawn_worker
) -> None:
    """ack only after success: a worker SIGKILLed mid-actor never acked, so the message
    comes back (after ack_wait) to another worker, which completes it. While the victim
    was alive its +WPI heartbeat kept the message from being redelivered, although it
    held it for longer than ack_wait."""
    broker = make_broker(settings)
    actors = declare_test_actors(broker, effects)
    victim = spawn_worker(extra_env={HOLD_ENV: "120"})
    wait_ready(effects, [victim])
    actors.hold.send("k")
    effects.wait_for(lambda e: any(x.kind == "start" for x in e), 10, "victim start")
    [start] = effects.of("start")
    assert start.pid == victim.pid

    survivor = spawn_worker()
    wait_ready(effects, [survivor])
    # Hold it well past ack_wait before the kill: only the heartbeat prevents redelivery.
    time.sleep(max(0.0, start.at + settings.ack_wait_s * 1.5 - time.time()))
    assert [e.pid for e in effects.of("start")] == [victim.pid], "redelivered while running"
    victim.signal(signal.SIGKILL)
    victim.wait(5)
    killed_at = time.time()

    effects.wait_for(
        lambda e: any(x.kind == "done" for x in e), settings.ack_wait_s + 10, "redelivered run"
    )
    broker.join(QUEUE, timeout=5_000)
    time.sleep(0.3)  # a window for a duplicate to show: not a wait for a condition
    done = effects.of("done")
    assert [(e.key, e.pid) for e in done] == [("k", survivor.pid)]
    assert [e.pid for e in effects.of("start")] == [victim.pid, survivor.pid]
    assert done[0].at - killed_at <= settings.ack_wait_s + 3
    info = broker.consumer_info(QUEUE)
    assert (info.num_pending, info.num_ack_pending) == (0, 0)


def test_sigterm_drains_without_losing_or_repeating(
    settings, make_broker, effects, spawn_worker
) -> None:
    """SIGTERM with messages running and prefetched: the running ones finish and are
    acked by the stopping worker, the prefetched ones are nak'd at once and run by the
    other worker; each message runs exactly once, and nothing waits for ack_wait."""
    settings = settings.model_copy(update={"ack_wait_s": 15.0})
    broker = make_broker(settings)
    actors = declare_test_actors(broker, effects)
    stopping = spawn_worker(ack_wait_s=settings.ack_wait_s)
    wait_ready(effects, [stopping])
    keys = [f"m{i}" for i in range(8)]
    for key in keys:
        actors.hold.send(key, 0.6)

    # 2 worker threads -> dramatiq prefetch 4: 2 running, 2 waiting in the work queue.
    deadline = time.monotonic() + 10
    while broker.consumer_info(QUEUE).num_ack_pending < 4 or len(effects.of("start")) < 2:
        assert time.monotonic() < deadline, "worker did not prefetch"
        time.sleep(0.02)
    stopping.signal(signal.SIGTERM)
    term_at = time.time()
    other = spawn_worker(ack_wait_s=settings.ack_wait_s)
    assert stopping.wait(20) == 0, stopping.log()

    effects.wait_for(lambda e: sum(x.kind == "done" for x in e) >= 8, 20, "all 8 done")
    broker.join(QUEUE, timeout=5_000)
    time.sleep(0.3)  # a window for a duplicate to show: not a wait for a condition
    assert effects.counts("done") == dict.fromkeys(keys, 1)
    assert effects.counts("start") == dict.fromkeys(keys, 1), "an in-flight run was repeated"
    by_stopping = {e.key for e in effects.of("start") if e.pid == stopping.pid}
    assert len(by_stopping) >= 2
    assert by_stopping == {e.key for e in effects.of("done") if e.pid == stopping.pid}
    assert {e.pid for e in effects.of("done")} == {stopping.pid, other.pid}
    # Requeued at once, not after ack_wait (15 s).
    assert max(e.at for e in effects.of("done")) - term_at < settings.ack_wait_s - 5


def test_three_workers_share_one_queue(settings, make_broker, effects, spawn_worker) -> None:
    broker = make_broker(settings)
    actors = declare_test_actors(broker, effects)
    workers = [spawn_worker() for _ in range(3)]
    wait_ready(effects, workers)
    n = 60
    keys = [f"m{i}" for i in range(n)]
    for key in keys:
        actors.hold.send(key, 0.05)
    effects.wait_for(lambda e: sum(x.kind == "done" for x in e) >= n, 30, f"{n} done")
    broker.join(QUEUE, timeout=5_000)
    time.sleep(0.3)  # a window for a duplicate to show: not a wait for a condition
    done = effects.of("done")
    assert len(done) == n
    assert effects.counts("done") == dict.fromkeys(keys, 1), "a message ran twice"
    per_worker = {w.pid: sum(e.pid == w.pid for e in done) for w in workers}
    assert all(count > 0 for count in per_worker.values()), per_worker
