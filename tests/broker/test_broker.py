"""JetStreamBroker with a dramatiq Worker in this process, against real nats-servers."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import nats.errors
import pytest
from dramatiq.message import Message
from prometheus_client import CollectorRegistry

from broker.jetstream import JetStreamBroker, dead_letters
from broker.jetstream.dead_letters import Reason
from broker.jetstream.errors import connection_closed
from broker.jetstream.loop import WaitExpired
from broker.jetstream.metrics import JetStreamMetrics
from broker.jetstream.names import Names
from broker.jetstream.publish import dedupe_id
from tests.broker.actors import declare_test_actors, probe_resource
from tests.broker.conftest import running_worker

QUEUE = "default"


def metric(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def dead_letter_page(broker: JetStreamBroker, **kwargs: Any) -> dead_letters.DeadLetterPage:
    return broker.run(dead_letters.list_dead_letters(broker.runtime.js, broker.names, **kwargs))


@pytest.mark.fast
def test_names_never_collide() -> None:
    names = Names("modelforge")
    # "." is not allowed in consumer names; "~" is not allowed in queue names.
    assert names.durable("a.b") == "tasks-a~b"
    assert names.durable("a_b") != names.durable("a.b")
    assert names.task_subject("a.b") == "modelforge.tasks.a.b"
    assert names.tasks_stream == "MODELFORGE_TASKS"
    assert names.dead_letter_stream == "MODELFORGE_DEAD_LETTERS"


@pytest.mark.fast
def test_dedupe_id_per_generation() -> None:
    message: Message[Any] = Message(queue_name="q", actor_name="a", args=(), kwargs={}, options={})
    assert dedupe_id(message) == message.message_id
    assert dedupe_id(message.copy(options={"retries": 2})) == f"{message.message_id}.retry-2"
    replayed = message.copy(options={"replays": 1, "retries": 1})
    assert dedupe_id(replayed) == f"{message.message_id}.replay-1.retry-1"


def test_a_request_timeout_of_nats_py_is_not_reported_as_the_brokers_wait(
    settings, make_broker
) -> None:
    """A request nobody answers ends at nats-py's own 0.3 s timeout, long before the
    broker's 10 s wait; the error names the one that fired."""
    broker = make_broker(settings)
    nc = broker.runtime.nc
    subject = f"{settings.namespace}.silent"

    async def unanswered() -> None:
        silent = await nc.subscribe(subject)  # takes the request, never replies
        try:
            await nc.request(subject, b"", timeout=0.3)
        finally:
            await silent.unsubscribe()

    started = time.monotonic()
    with pytest.raises(nats.errors.TimeoutError) as raised:
        broker.run(unanswered(), 10.0)
    assert time.monotonic() - started < 5
    assert not isinstance(raised.value, WaitExpired)
    message = str(connection_closed(raised.value))
    assert "nats: timeout (the operation's own timeout)" in message
    assert "10.0s" not in message


def test_round_trip_sync_and_async_actor(settings, make_broker, effects) -> None:
    registry = CollectorRegistry()
    probe = probe_resource()
    broker = make_broker(settings, registry=registry, resources=[probe])
    actors = declare_test_actors(broker, effects, probe)
    with running_worker(broker):
        actors.record.send("sync-1")
        actors.record_async.send("async-1")
        broker.join(QUEUE, timeout=10_000)
        opened = probe.get()
    assert effects.counts("done") == {"sync-1": 1, "async-1": 1}
    assert opened.closed, "the async resource is disposed at worker shutdown"
    with pytest.raises(RuntimeError):
        probe.get()
    info = broker.consumer_info(QUEUE)
    assert (info.num_pending, info.num_ack_pending, info.num_redelivered) == (0, 0, 0)
    processed = "modelforge_messages_processed_total"
    assert metric(registry, processed, queue=QUEUE, actor="record") == 1
    assert metric(registry, processed, queue=QUEUE, actor="record_async") == 1


def test_duplicate_enqueue_is_deduplicated(settings, make_broker, effects) -> None:
    broker = make_broker(settings)
    actors = declare_test_actors(broker, effects)
    message = actors.record.message("once")
    broker.enqueue(message)
    broker.enqueue(message)  # same message_id -> same Nats-Msg-Id: dropped by the stream
    with running_worker(broker):
        broker.join(QUEUE, timeout=10_000)
        time.sleep(0.3)  # a window for a duplicate to show: not a wait for a condition
    assert effects.counts("done") == {"once": 1}


def test_delayed_message_waits_on_the_server_not_in_a_worker(
    settings, make_broker, effects
) -> None:
    """A 3 s delay with ack_wait 1 s: if any client held the message unacked while
    waiting, the server would redeliver it after 1 s (num_redelivered > 0, a second
    consumer delivery). Instead the first delivery is nak'd with the remaining delay
    and the server's redelivery timer holds it; the worker holds nothing."""
    settings = settings.model_copy(update={"ack_wait_s": 1.0})
    broker = make_broker(settings)
    actors = declare_test_actors(broker, effects)
    delay_ms = 3000
    with running_worker(broker) as worker:
        sent_at = time.time()
        actors.record.send_with_options(args=("later",), delay=delay_ms)
        eta = sent_at + delay_ms / 1000
        assert broker.get_declared_delay_queues() == set()
        while time.time() < eta - 0.3:
            assert not effects.of("done"), "delivered before its ETA"
            info = broker.consumer_info(QUEUE)
            assert info.num_redelivered == 0
            assert info.delivered.consumer_seq <= 1
            # nak(delay) keeps the message in the server's ack-pending set (measured on
            # 2.9 and 2.15) as a timer; no process holds it:
            assert info.num_ack_pending <= 1
            assert broker.in_flight(QUEUE) == 0
            assert all(c.delay_queue.qsize() == 0 for c in worker.consumers.values())
            time.sleep(0.2)
        done = effects.wait_for(lambda e: any(x.kind == "done" for x in e), 5.0, "delayed run")
        done_at = time.time()
        broker.join(QUEUE, timeout=5_000)
    assert [e.key for e in done if e.kind == "done"] == ["later"]
    assert eta - 0.05 <= done_at <= eta + 2.0
    info = broker.consumer_info(QUEUE)
    # One delivery nak'd for the ETA, one run: nothing else.
    assert info.delivered.consumer_seq == 2
    assert info.num_ack_pending == 0


def test_retries_back_off_then_dead_letter(settings, make_broker, effects) -> None:
    registry = CollectorRegistry()
    broker = make_broker(settings, registry=registry)
    actors = declare_test_actors(broker, effects)  # fail: max_retries=2, min_backoff=200ms
    with running_worker(broker):
        message = actors.fail.send("doomed")
        effects.wait_for(lambda e: len(e) >= 3, 10.0, "three attempts")
        # Empty queue: the last failure was dead-lettered and acked, no retry is pending.
        broker.join(QUEUE, timeout=5_000)
    page = dead_letter_page(broker)
    attempts = effects.of("attempt")
    assert len(attempts) == 3, "1 run + max_retries=2, then no more"
    times = [e.at for e in attempts]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # compute_backoff: 200ms * 2**n * U(1, 2) -> [200, 400) then [400, 800).
    assert gaps[0] >= 0.19 and gaps[1] >= 0.39, gaps

    [letter] = page.items
    assert letter.queue_name == QUEUE
    assert letter.reason == Reason.FAILED
    assert letter.exception_type == "RuntimeError"
    assert "always fails" in letter.error
    assert letter.message_id == message.message_id
    assert letter.retries == 3  # dramatiq's counter: failed runs
    assert letter.deliveries >= 1
    original = letter.message()
    assert original is not None and original.args == ("doomed",)
    assert "traceback" in original.options
    # The failed original was acked: nothing left in the queue.
    info = broker.consumer_info(QUEUE)
    assert (info.num_pending, info.num_ack_pending) == (0, 0)
    dead = "modelforge_messages_dead_lettered_total"
    assert metric(registry, dead, queue=QUEUE, reason="failed") == 1
    failed = "modelforge_messages_failed_total"
    assert metric(registry, failed, queue=QUEUE, actor="fail") == 3


def test_replay_from_dead_letters_runs_it_again(settings, make_broker, effects, tmp_path) -> None:
    broker = make_broker(settings)
    actors = declare_test_actors(broker, effects)  # flaky: max_retries=0
    flag = tmp_path / "flag"
    js, names = broker.runtime.js, broker.names
    with running_worker(broker):
        for key in ("a", "b", "c"):
            actors.flaky.send(key, str(flag))
        effects.wait_for(lambda e: len(e) >= 3, 10.0, "three failed attempts")
        broker.join(QUEUE, timeout=10_000)

        # Paged by stream sequence, oldest first.
        first = dead_letter_page(broker, limit=2)
        assert [d.reason for d in first.items] == [Reason.FAILED, Reason.FAILED]
        assert first.next_seq is not None
        rest = dead_letter_page(broker, start_seq=first.next_seq, limit=2)
        assert rest.next_seq is None and len(rest.items) == 1
        decoded = [(d.message(), d) for d in first.items + rest.items]
        by_key = {m.args[0]: d for m, d in decoded if m is not None}
        assert set(by_key) == {"a", "b", "c"}
        assert all(d.exception_type == "ValueError" for d in by_key.values())

        flag.touch()
        replayed = broker.run(dead_letters.replay(js, names, by_key["a"].seq, timeout_s=3.0))
        assert replayed.options["replays"] == 1 and "retries" not in replayed.options
        effects.wait_for(lambda e: any(x.kind == "done" for x in e), 10.0, "replayed run")
        broker.join(QUEUE, timeout=10_000)

        assert broker.run(dead_letters.delete(js, names, by_key["b"].seq))
        assert not broker.run(dead_letters.delete(js, names, by_key["b"].seq))
        remaining = dead_letter_page(broker)
        assert [d.seq for d in remaining.items] == [by_key["c"].seq]
        broker.run(dead_letters.purge(js, names, QUEUE))
        assert dead_letter_page(broker).items == []
        with pytest.raises(dead_letters.DeadLetterNotFound):
            broker.run(dead_letters.get_dead_letter(js, names, by_key["a"].seq))
    assert effects.counts("done") == {"a": 1}
    assert effects.counts("attempt") == {"a": 2, "b": 1, "c": 1}


def test_crash_loop_is_dead_lettered_after_max_deliveries(settings, make_broker, effects) -> None:
    """Deliveries that never settle (here: fetched and dropped by a raw client, as a
    killed worker would) are bounded by max_deliveries; then the message is
    dead-lettered without running."""
    registry = CollectorRegistry()
    broker = make_broker(settings, registry=registry)
    actors = declare_test_actors(broker, effects)
    message = actors.record.send("poison")
    js, names = broker.runtime.js, broker.names

    async def crash_deliveries(count: int) -> None:
        sub = await js.pull_subscribe_bind(names.durable(QUEUE), names.tasks_stream)
        for _ in range(count):
            [msg] = await sub.fetch(1, timeout=3)
            await msg.nak()  # stands in for "worker died, ack_wait expired"
        await sub.unsubscribe()

    broker.run(crash_deliveries(settings.max_deliveries), timeout_s=20)
    with running_worker(broker):
        broker.join(QUEUE, timeout=10_000)
    assert effects.of("done") == []
    [letter] = dead_letter_page(broker).items
    assert letter.reason == Reason.MAX_DELIVERIES
    assert letter.deliveries == settings.max_deliveries + 1
    assert letter.message_id == message.message_id
    dead = "modelforge_messages_dead_lettered_total"
    assert metric(registry, dead, queue=QUEUE, reason="max_deliveries") == 1


def test_undecodable_message_is_dead_lettered(settings, make_broker, effects) -> None:
    broker = make_broker(settings)
    declare_test_actors(broker, effects)
    js, names = broker.runtime.js, broker.names
    broker.run(js.publish(names.task_subject(QUEUE), b"not json"))
    with running_worker(broker):
        broker.join(QUEUE, timeout=10_000)
    [letter] = dead_letter_page(broker).items
    assert letter.reason == Reason.UNDECODABLE
    assert letter.payload == b"not json"
    assert letter.message() is None
    with pytest.raises(ValueError, match="cannot be replayed"):
        broker.run(dead_letters.replay(js, names, letter.seq, timeout_s=3.0))


def test_declarations_are_idempotent_and_update(settings, make_broker, effects) -> None:
    first = make_broker(settings)
    declare_test_actors(first, effects)
    assert first.consumer_info(QUEUE).config.ack_wait == settings.ack_wait_s
    # Another process with a changed setting: same streams, consumer brought up to date.
    second = make_broker(settings.model_copy(update={"ack_wait_s": 7.0}))
    declare_test_actors(second, effects)
    assert second.consumer_info(QUEUE).config.ack_wait == 7.0
    info = second.run(second.runtime.js.stream_info(second.names.tasks_stream))
    assert info.config.retention == "workqueue"


def test_redelivery_and_lag_metrics(settings, make_broker, effects) -> None:
    registry = CollectorRegistry()
    broker = make_broker(settings, registry=registry)
    actors = declare_test_actors(broker, effects)
    [metrics] = [m for m in broker.middleware if isinstance(m, JetStreamMetrics)]
    for key in ("a", "b", "c"):
        actors.record.send(key)
    metrics.refresh(broker)
    assert metric(registry, "modelforge_consumer_pending", queue=QUEUE) == 3
    js, names = broker.runtime.js, broker.names

    async def one_crashed_delivery() -> None:
        sub = await js.pull_subscribe_bind(names.durable(QUEUE), names.tasks_stream)
        [msg] = await sub.fetch(1, timeout=3)
        await msg.nak()  # as if the worker holding it had died
        await sub.unsubscribe()

    broker.run(one_crashed_delivery())
    with running_worker(broker):
        broker.join(QUEUE, timeout=10_000)
    assert effects.counts("done") == {"a": 1, "b": 1, "c": 1}
    assert metric(registry, "modelforge_messages_redelivered_total", queue=QUEUE) == 1
    metrics.refresh(broker)
    assert metric(registry, "modelforge_consumer_pending", queue=QUEUE) == 0
    assert metric(registry, "modelforge_consumer_ack_pending", queue=QUEUE) == 0


def test_closing_consumer_hands_back_what_its_last_pull_request_delivered(
    settings, make_broker, effects
) -> None:
    """A pull request can still be open on the server when dramatiq closes the consumer
    (shutdown, consumer restart). Whatever it delivers must be handed back at once, not
    left unacked in a dropped inbox until ack_wait (30 s here)."""
    broker = make_broker(settings.model_copy(update={"ack_wait_s": 30.0}))
    actors = declare_test_actors(broker, effects)
    consumer = broker.consume(QUEUE, prefetch=1, timeout=3000)
    broker.run(consumer._puller.request())  # white-box: a request now waits 3 s on the server
    closer = threading.Thread(target=consumer.close)
    closer.start()
    time.sleep(0.2)  # pacing: the close is under way before the message is sent
    actors.record.send("late")  # delivered to the closing consumer's request
    closer.join(5)
    assert not closer.is_alive()
    # Nak'd by close(): the next worker gets it now. Had it been left in the dropped
    # inbox, nobody could run it before ack_wait (30 s) and join would time out.
    with running_worker(broker):
        broker.join(QUEUE, timeout=5_000)
    assert effects.counts("done") == {"late": 1}
