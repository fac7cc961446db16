"""`modelforge worker` processes on real PostgreSQL and NATS: shared load, crashes, dead letters."""

from __future__ import annotations

import collections
import signal
import time
from datetime import datetime, timedelta
from typing import Any

import pytest

from schemas.protocol import AUDIT, DEAD_LETTERS
from stack.embedded_nats import EmbeddedNats
from tests.agent.harness import wait_until
from tests.api_server import ApiFactory, RunningApi
from tests.flows import HEARTBEAT, enroll, heartbeat_body, now
from tests.worker_processes import STALE_S, Workers


def _liveness_audit(api: RunningApi) -> dict[str, list[tuple[str, str, str]]]:
    with api.client() as client:
        rows: list[dict[str, Any]] = []
        before: int | None = None
        while True:
            params: dict[str, Any] = {"action": "node.liveness.changed", "limit": 1000}
            if before is not None:
                params["before_id"] = before
            page = client.get(AUDIT, params=params, headers=api.admin_headers).json()
            rows += page["items"]
            before = page["next_before_id"]
            if before is None:
                break
    by_node: dict[str, list[tuple[str, str, str]]] = collections.defaultdict(list)
    # Audit rows are written by whichever worker consumes the event, so with several
    # workers their ids need not follow the transitions; the event's time does.
    for row in sorted(rows, key=lambda r: (datetime.fromisoformat(r["at"]), r["id"])):
        details = row["details"]
        by_node[row["target_id"]].append(
            (details["previous"], details["current"], details["decided_by"])
        )
    return by_node


@pytest.mark.slow
def test_three_workers_share_sweeps_and_survive_a_sigkill(
    api_factory: ApiFactory, workers: Workers
) -> None:
    api = workers.api(api_factory)
    workers.start(3)
    with api.client() as client:
        nodes = [enroll(client, api, hostname=f"n{i}") for i in range(24)]
        for i, node in enumerate(nodes):
            # A third of the agents have clocks a year ahead: liveness must not care.
            observed = (now() + timedelta(days=365)).isoformat() if i % 3 == 0 else None
            body = heartbeat_body(node.node_id, observed_at=observed)
            assert client.post(HEARTBEAT, json=body, headers=node.headers).status_code == 200
    # Kill one worker mid-stream, while sweeps are due and running: the time must pass
    # for them to be due (the database clock decides), so this is no wait for a state.
    time.sleep(STALE_S + 0.3)
    workers.procs[0].send_signal(signal.SIGKILL)
    expected = [
        ("offline", "online", "heartbeat"),
        ("online", "stale", "sweep"),
        ("stale", "offline", "sweep"),
    ]

    def all_offline() -> bool:
        audit = _liveness_audit(api)
        return all(len(audit[node.node_id]) >= 3 for node in nodes)

    wait_until(all_offline, 30, "every node to go offline")
    # Let any late duplicate show itself before judging (a window for what must not
    # happen, not a wait for a condition).
    time.sleep(1.5)
    audit = _liveness_audit(api)
    for node in nodes:
        assert audit[node.node_id] == expected, (node.node_id, audit[node.node_id])

    # Sweep rows name the broker message that caused them.
    with api.client() as client:
        system = client.get(
            AUDIT, params={"actor": "worker:liveness", "limit": 5}, headers=api.admin_headers
        ).json()["items"]
    assert system and all(r["correlation_id"].startswith("liveness_sweep-") for r in system)

    # Nodes come back on their own heartbeat, once; the sweepers leave them alone.
    with api.client() as client:
        for node in nodes[:6]:
            body = heartbeat_body(node.node_id)
            assert client.post(HEARTBEAT, json=body, headers=node.headers).status_code == 200
    api.settle()  # the workers' audit rows of those heartbeats
    audit = _liveness_audit(api)
    for node in nodes[:6]:
        assert audit[node.node_id] == [*expected, ("offline", "online", "heartbeat")]
    # The two survivors did the work (and the killed one did some before it died).
    logs = workers.logs()
    assert logs.count("-> offline") == len(nodes), logs[-3000:]


@pytest.mark.slow
def test_poison_message_is_dead_lettered_and_replayable(
    api_factory: ApiFactory, workers: Workers
) -> None:
    api = workers.api(api_factory)
    workers.start(1)
    poison = workers.enqueue_poison()

    def listed() -> list[dict[str, Any]]:
        with api.client() as client:
            response = client.get(DEAD_LETTERS, headers=api.admin_headers)
            assert response.status_code == 200, response.text
            items: list[dict[str, Any]] = response.json()["items"]
            return items

    wait_until(lambda: len(listed()) == 1, 30, "the poison message in the dead-letter stream")
    (entry,) = listed()
    assert entry["message_id"] == poison.message_id
    assert entry["actor_name"] == "liveness_sweep"
    assert entry["reason"] == "failed"
    assert entry["exception_type"] == "TypeError"
    # dramatiq counts failed runs: the first run plus max_retries=2 retries.
    assert entry["retries"] == 3
    with api.client() as client:
        one = client.get(f"{DEAD_LETTERS}/{entry['seq']}", headers=api.admin_headers)
        assert one.status_code == 200 and one.json() == entry
        replayed = client.post(f"{DEAD_LETTERS}/{entry['seq']}/replay", headers=api.admin_headers)
        assert replayed.status_code == 200, replayed.text
        assert replayed.json()["queue"] == "liveness"
        gone = client.get(f"{DEAD_LETTERS}/{entry['seq']}", headers=api.admin_headers)
        assert gone.status_code == 404
    # Replayed with a fresh retry budget: it runs (and fails) 3 more times, then returns.
    wait_until(lambda: len(listed()) == 1 and listed()[0]["seq"] != entry["seq"], 30, "the replay")
    again = listed()[0]
    assert again["message_id"] == poison.message_id and again["retries"] == 3
    with api.client() as client:
        deleted = client.delete(f"{DEAD_LETTERS}/{again['seq']}", headers=api.admin_headers)
        assert deleted.status_code == 204
        assert (
            client.delete(f"{DEAD_LETTERS}/{again['seq']}", headers=api.admin_headers).status_code
            == 404
        )
    assert listed() == []


def test_dead_letter_routes_answer_503_while_nats_is_down(
    api_factory: ApiFactory, workers: Workers, nats_server: EmbeddedNats
) -> None:
    api = workers.api(api_factory)
    nats_server.stop()
    with api.client() as client:
        response = client.get(DEAD_LETTERS, headers=api.admin_headers)
        assert response.status_code == 503
        assert response.json()["code"] == "broker_unavailable"
        # Everything else still works without NATS.
        node = enroll(client, api)
        body = heartbeat_body(node.node_id)
        assert client.post(HEARTBEAT, json=body, headers=node.headers).status_code == 200
    nats_server.start()
    with api.client() as client:
        assert client.get(DEAD_LETTERS, headers=api.admin_headers).status_code == 200
