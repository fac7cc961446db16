"""`modelforge admin dead-letters get|replay|delete` on a real dead letter: a poison
message that a real `modelforge worker` process ran, failed and gave up on, in the real
JetStream dead-letter stream. Replayed, it runs (and fails) again, which shows it was
really sent back to its queue. Every refusal is the CLI's one line."""

from __future__ import annotations

import pytest

from schemas.admin import DeadLetterInfo, DeadLetterList, DeadLetterReplayed
from tests.agent.harness import wait_until
from tests.api_server import ApiFactory, RunningApi
from tests.cli_support import Admin, failed, ok
from tests.worker_processes import Workers

pytest_plugins = ["tests.cli_fixtures"]

# The first run and two retries at 0.1-0.2 s backoff, after a worker process started.
DEAD_S = 30.0


@pytest.fixture
def api(api_factory: ApiFactory, workers: Workers) -> RunningApi:
    """The API on the worker processes' NATS and namespace, where their dead letters are
    (the workers relay and audit: no second pipeline)."""
    return workers.api(api_factory)


@pytest.mark.slow
def test_dead_letters_get_replay_delete(admin: Admin, api: RunningApi, workers: Workers) -> None:
    workers.start(1)
    message = workers.enqueue_poison()

    def listed() -> list[DeadLetterInfo]:
        return DeadLetterList.model_validate_json(ok(admin("dead-letters", "list", "--json"))).items

    (entry,) = wait_until(listed, DEAD_S, "the poison message dead-lettered")
    got = DeadLetterInfo.model_validate_json(
        ok(admin("dead-letters", "get", str(entry.seq), "--json"))
    )
    assert got == entry and got.message_id == message.message_id
    assert (got.queue, got.actor_name, got.reason) == ("liveness", "liveness_sweep", "failed")
    # dramatiq counts failed runs: the first run plus max_retries=2 retries.
    assert got.exception_type == "TypeError" and got.retries == 3
    shown = ok(admin("dead-letters", "get", str(entry.seq)))
    assert "liveness_sweep" in shown and "TypeError" in shown and message.message_id in shown

    replayed = DeadLetterReplayed.model_validate_json(
        ok(admin("dead-letters", "replay", str(entry.seq), "--json"))
    )
    assert replayed == DeadLetterReplayed(
        seq=entry.seq, queue="liveness", message_id=message.message_id
    )
    # Out of the dead-letter stream, and back on its queue with a fresh retry budget: the
    # worker runs it three more times, fails, and it is dead-lettered again.
    failed(admin("dead-letters", "get", str(entry.seq)), "not_found")
    failed(admin("dead-letters", "replay", str(entry.seq)), "not_found")
    (again,) = wait_until(
        lambda: [d for d in listed() if d.seq != entry.seq], DEAD_S, "the replay dead-lettered"
    )
    assert again.message_id == message.message_id and again.retries == 3

    deleted = ok(admin("dead-letters", "delete", str(again.seq)))
    assert deleted.strip() == f"deleted dead letter {again.seq}"
    assert listed() == []
    failed(admin("dead-letters", "delete", str(again.seq)), "not_found")
    # Not a sequence: typer's usage line, before any request.
    zero = admin("dead-letters", "get", "0")
    assert zero.returncode == 2 and "Traceback" not in zero.stderr
