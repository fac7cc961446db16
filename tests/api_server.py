"""A real API server on loopback for tests: uvicorn in a thread, real TCP, real PostgreSQL.

Used as a pytest plugin (see conftest.py). Clients talk to it over HTTP exactly as
agents and operators do; nothing in the app is replaced.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from api.server import ApiServer, api_server
from api.settings import ApiSettings
from api.state import ApiState
from store.liveness import LivenessThresholds
from tests.pipeline import RunningPipeline, settle

OPERATOR_KEY = "test-operator-key-0123456789abcdef"
# Tests run liveness on thresholds of a second or two, which would derive a presence gap
# of a fraction of a second (store/liveness.py): then a GIL pause of the in-process API
# reads as an outage and grants restart grace mid-test. The sweepers in tests use the
# same default (LivenessThresholds); tests of restart grace set their own gap.
PRESENCE_GAP_S = 5.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class RunningApi:
    base_url: str
    settings: ApiSettings
    server: ApiServer
    thread: threading.Thread
    # The workers' event pipeline on this API's database (tests/pipeline.py), if any.
    pipeline: RunningPipeline | None = None

    def settle(self) -> None:
        """Wait for the workers' side of every change so far: audit rows, reconciliation
        (by the pipeline beside this API, or by worker processes the test runs)."""
        settle(self.settings.database_url, self.pipeline)

    @property
    def state(self) -> ApiState:
        """What the in-process API holds (its node cache, its heartbeat buffer): for the
        few tests that must look inside it, or hold something back from it."""
        app = self.server.config.app
        assert isinstance(app, FastAPI)
        state: ApiState = app.state.modelforge
        return state

    @property
    def admin_headers(self) -> dict[str, str]:
        return {"X-ModelForge-Admin-Token": OPERATOR_KEY}

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=30, **kwargs)

    def async_client(self, **kwargs: Any) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
        return httpx.AsyncClient(base_url=self.base_url, timeout=60, limits=limits, **kwargs)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


def start_api(settings: ApiSettings) -> RunningApi:
    server = api_server(
        settings,
        host="127.0.0.1",
        port=settings.port,
        log_config=None,
        access_log=False,
        lifespan="on",
        # Longer than any pause in a test: a pooled connection closed by the server
        # at the instant a client reuses it surfaces as a spurious ReadError.
        timeout_keep_alive=120,
    )
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("test API server did not start")
        time.sleep(0.02)
    return RunningApi(f"http://127.0.0.1:{settings.port}", settings, server, thread)


ApiFactory = Callable[..., RunningApi]


@pytest.fixture
def api_factory(
    database_url: str, nats_url: str, request: pytest.FixtureRequest
) -> Iterator[ApiFactory]:
    """Start an API against this test's database; keyword arguments override settings.

    Beside it runs the workers' event pipeline (the `pipeline` fixture), as a stack
    always has workers. pipeline=False: none, for tests that run their own relay or real
    worker processes.
    """
    started: list[RunningApi] = []

    def factory(*, pipeline: bool = True, **overrides: Any) -> RunningApi:
        values: dict[str, Any] = {
            "database_url": database_url,
            "nats_url": nats_url,
            "operator_api_key": OPERATOR_KEY,
            "port": free_port(),
            "db_pool_size": 20,
            "presence_gap_s": PRESENCE_GAP_S,
            # Never the real Hub from a test: a closed port unless a test gives its own.
            "artifact_source_url": "http://127.0.0.1:9",
        }
        workers: RunningPipeline | None = None
        if pipeline and overrides.get("database_url", database_url) == database_url:
            workers = request.getfixturevalue("pipeline")
            # The NATS the relay publishes to: the API's job notifications come from it.
            values["nats_url"] = workers.nats_url
        values.update(overrides)
        running = start_api(ApiSettings(**values))
        running.pipeline = workers
        started.append(running)
        return running

    yield factory
    for running in started:
        running.stop()


@pytest.fixture
def api(api_factory: ApiFactory) -> RunningApi:
    return api_factory()


def api_on_thresholds(
    api_factory: ApiFactory, thresholds: LivenessThresholds, **overrides: Any
) -> RunningApi:
    """An API on these liveness thresholds, its presence refreshed every 0.1 s, as the
    fleet-safety tests run it (keyword arguments override settings, as api_factory's)."""
    return api_factory(
        stale_after_s=thresholds.stale_after_s,
        offline_after_s=thresholds.offline_after_s,
        restart_grace_s=thresholds.restart_grace_s,
        presence_gap_s=thresholds.presence_gap_s,
        presence_period_s=0.1,
        **overrides,
    )
