"""The workers' event pipeline beside an in-process test API (relay → JetStream → audit
and reconcile consumers), as `modelforge worker` runs it: the same `Pipeline` class, a
real NATS JetStream server and the test's own PostgreSQL database.

Each pipeline gets a private nats-server (about 0.1 s to start): the event stream is
global to a server, and a consumer reading another test's events would write them into
this test's audit log.

Used as a pytest plugin (conftest.py): the `pipeline` fixture; api_factory starts it
for every API it starts on the test's database.

Since audit rows and GPU reconciliation are written by workers after the request has
answered, tests read them through `settle()` first: it waits until every committed
event has its audit row and no accepted inventory is left unreconciled.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import NullPool
from sqlalchemy.ext.asyncio import create_async_engine

from stack.embedded_nats import EmbeddedNats
from store import audit, inventory
from store.engine import make_engine, make_sessionmaker
from tests.services import run_async
from workers.pipeline import Pipeline, PipelineSettings


async def backlog(database_url: str) -> audit.Backlog:
    engine = create_async_engine(database_url, poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            return await audit.backlog(conn)
    finally:
        await engine.dispose()


def settle(
    database_url: str, pipeline: RunningPipeline | None = None, timeout_s: float = 20.0
) -> None:
    """Wait until the audit log and the node views reflect every committed change, by
    whichever workers run: the in-process pipeline or real worker processes."""
    deadline = time.monotonic() + timeout_s
    while True:
        if pipeline is not None:
            pipeline.check()
        pending = run_async(lambda: backlog(database_url))
        if pending.settled:
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"pipeline not settled after {timeout_s} s: {pending.unreconciled} inventory"
                f" reports unreconciled, {pending.unaudited} events without an audit row"
            )
        time.sleep(0.02)


async def reconcile_now(database_url: str, node_id: str) -> None:
    """Reconcile one node's accepted inventory here and now, as the reconcile consumer
    would: for tests that run the relay themselves and need the GPU events."""
    engine = make_engine(database_url, pool_size=1)
    try:
        async with make_sessionmaker(engine)() as session, session.begin():
            await inventory.reconcile(session, uuid.UUID(node_id))
    finally:
        await engine.dispose()


class RunningPipeline:
    def __init__(self, database_url: str, store_dir: Path, nats_url: str | None = None) -> None:
        """A private NATS under store_dir, unless the test brings its own (nats_url)."""
        self.database_url = database_url
        self.nats = EmbeddedNats(store_dir) if nats_url is None else None
        self.nats_url = nats_url
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="pipeline", daemon=True)
        self._ready = threading.Event()

    def start(self) -> RunningPipeline:
        if self.nats is not None:
            self.nats.start()
            self.nats_url = self.nats.url
        self._thread.start()
        if not self._ready.wait(20):
            raise RuntimeError("the test pipeline did not start")
        return self

    def _main(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        engine = make_engine(self.database_url, pool_size=4)
        pipeline = Pipeline(
            make_sessionmaker(engine),
            self.database_url,
            PipelineSettings(
                self.nats_url or "", relay_poll_interval_s=0.5, consumer_batch_size=100
            ),
        )
        self._ready.set()
        try:
            await pipeline.run(self._stop)
        except BaseException as exc:
            self._failure = exc
            raise
        finally:
            await engine.dispose()

    def check(self) -> None:
        if self._failure is not None:
            raise AssertionError(f"the test pipeline failed: {self._failure!r}")

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=20)
        if self.nats is not None:
            self.nats.stop()


@pytest.fixture
def pipeline(
    database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningPipeline]:
    """The workers' event pipeline on this test's database, with a private NATS."""
    running = RunningPipeline(database_url, tmp_path_factory.mktemp("pipeline")).start()
    try:
        yield running
    finally:
        running.stop()
