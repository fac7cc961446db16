"""`/readyz` answers for the whole pipeline: the database, NATS and the relay's backlog."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from schemas.health import FailingChild
from schemas.stack import SupervisorState, write_supervisor_state
from stack.embedded_nats import EmbeddedNats
from tests.api_server import ApiFactory, RunningApi
from tests.flows import TOKENS


def readiness(api: RunningApi) -> tuple[int, dict[str, Any]]:
    with api.client() as client:
        response = client.get("/readyz")
    assert response.headers.get("X-Correlation-ID")
    body: dict[str, Any] = response.json()
    assert body["ready"] is (response.status_code == 200), body
    return response.status_code, body


def eventually(api: RunningApi, status: int, timeout_s: float = 15) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        seen, body = readiness(api)
        if seen == status or time.monotonic() > deadline:
            assert seen == status, body
            return body
        time.sleep(0.1)


def test_readyz_follows_nats_down_and_back(
    api_factory: ApiFactory, nats_server: EmbeddedNats
) -> None:
    api = api_factory(nats_url=nats_server.url)
    body = eventually(api, 200)
    assert body == {
        "ready": True,
        "database": "ok",
        "nats": "ok",
        "outbox": {"state": "ok", "backlog": 0, "oldest_unsent_s": None},
        "partition_hold": False,
        "failing": [],
    }
    nats_server.stop()
    body = eventually(api, 503)
    assert body["nats"] == "unreachable" and body["database"] == "ok"
    nats_server.start()
    assert eventually(api, 200)["nats"] == "ok"


def test_readyz_reports_a_relay_that_does_not_keep_up(
    api_factory: ApiFactory, nats_server: EmbeddedNats
) -> None:
    # No worker runs here, so nothing relays the outbox: each token's event stays unsent.
    # No workers at all: nothing relays, so the backlog grows.
    api = api_factory(
        nats_url=nats_server.url,
        ready_outbox_lag_max_s=0.5,
        ready_outbox_backlog_max=2,
        pipeline=False,
    )
    with api.client() as client:
        response = client.post(TOKENS, json={}, headers=api.admin_headers)
        assert response.status_code == 201
    assert readiness(api)[0] == 200  # one event, just now: within both thresholds
    body = eventually(api, 503)
    assert body["outbox"]["state"] == "lagging" and body["outbox"]["oldest_unsent_s"] > 0.5
    with api.client() as client:
        for _ in range(3):
            client.post(TOKENS, json={}, headers=api.admin_headers)
    # Counted up to one past the threshold, never the whole table.
    assert readiness(api)[1]["outbox"]["backlog"] == 3


def test_readyz_reports_an_unreachable_database(
    api_factory: ApiFactory, nats_server: EmbeddedNats
) -> None:
    api = api_factory(
        nats_url=nats_server.url, database_url="postgresql+asyncpg://postgres@127.0.0.1:9/none"
    )
    status, body = readiness(api)
    assert status == 503
    assert body["database"] == "unreachable" and body["nats"] == "ok" and body["outbox"] is None
    # The API itself still answers, with a typed 503 rather than a 500.
    with httpx.Client(base_url=api.base_url, timeout=10) as client:
        response = client.get(TOKENS, headers=api.admin_headers)
    assert response.status_code == 503, response.text
    assert response.json()["code"] == "database_unavailable"
    assert response.headers["Retry-After"] == "1"


def test_readyz_names_the_children_up_reports_failing(
    api_factory: ApiFactory, nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """Under `modelforge up` a crash-looping worker is retried while the API serves; the
    API learns it from up's supervisor state file and is not ready meanwhile."""
    state_file = tmp_path / "supervisor.json"
    api = api_factory(nats_url=nats_server.url, supervisor_state_file=state_file)
    # No file yet (up writes it as it starts): nothing is failing.
    assert eventually(api, 200)["failing"] == []
    worker = FailingChild(
        name="modelforge worker", reason="exited 6 times within 60s (last exit status 1)"
    )
    write_supervisor_state(state_file, SupervisorState(failing=[worker]))
    body = eventually(api, 503)
    assert body["failing"] == [worker.model_dump()]
    assert body["database"] == "ok" and body["nats"] == "ok", body
    # Serving all the same: a change is accepted into the outbox.
    with api.client() as client:
        assert client.post(TOKENS, json={}, headers=api.admin_headers).status_code == 201
    write_supervisor_state(state_file, SupervisorState(failing=[]))
    assert eventually(api, 200)["failing"] == []
