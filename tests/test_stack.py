"""The embedded servers, the service fixtures and `modelforge up`, all with real processes."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import nats
import psutil
import pytest
from sqlalchemy import NullPool, text
from sqlalchemy.ext.asyncio import create_async_engine

from schemas.hub import HUB_URL, SOURCE_URL_ENV
from schemas.protocol import ADMIN_HEADER, TOKENS
from stack.embedded_nats import EmbeddedNats
from stack.embedded_postgres import EmbeddedPostgres
from stack.ports import free_port
from tests.up_process import StartUp

REPO = Path(__file__).resolve().parent.parent


async def scalar(url: str, sql: str) -> object:
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        async with engine.begin() as conn:
            return (await conn.execute(text(sql))).scalar()
    finally:
        await engine.dispose()


async def execute(url: str, *statements: str) -> None:
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        async with engine.begin() as conn:
            for statement in statements:
                await conn.execute(text(statement))
    finally:
        await engine.dispose()


def refuses_connections(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except OSError:
        return True


# --- EmbeddedPostgres ------------------------------------------------------------------


async def test_embedded_postgres_restart_keeps_data_and_port(pg_tmp_path: Path) -> None:
    server = EmbeddedPostgres(pg_tmp_path / "pg")
    try:
        server.start()
        port = server.port
        assert port not in (5432, 4222)
        server.ensure_database("modelforge")
        server.ensure_database("modelforge")  # idempotent
        url = server.url("modelforge")
        assert url == f"postgresql+asyncpg://postgres@127.0.0.1:{port}/modelforge"
        await execute(url, "create table kept (v text)", "insert into kept values ('yes')")

        server.stop()
        assert not server.running
        assert refuses_connections(port)
        assert "database system is shut down" in server.log_path.read_text()

        server.start()
        assert server.port == port  # remembered in the data dir
        assert await scalar(server.url("modelforge"), "select v from kept") == "yes"
    finally:
        server.stop()


async def test_embedded_postgres_recovers_from_a_crashed_run(pg_tmp_path: Path) -> None:
    """A run killed with SIGKILL leaves its postmaster running; the next start copes."""
    data_dir = pg_tmp_path / "pg"
    script = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from stack.embedded_postgres import EmbeddedPostgres\n"
        "server = EmbeddedPostgres(Path(sys.argv[1]))\n"
        "server.start()\n"
        "print(server.pid, flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    crashed = subprocess.run(
        [sys.executable, "-c", script, str(data_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    orphan = psutil.Process(int(crashed.stdout.strip()))
    assert orphan.is_running()

    server = EmbeddedPostgres(data_dir)
    try:
        server.start()
        assert not orphan.is_running()
        assert await scalar(server.url(), "select 1") == 1
    finally:
        server.stop()


async def test_embedded_postgres_ignores_a_stale_pid_file(pg_tmp_path: Path) -> None:
    server = EmbeddedPostgres(pg_tmp_path / "pg", durable=False)
    try:
        server.start()
        server.stop()
        # The pid of a live process that is not PostgreSQL, as after a reboot reused it.
        (server.pgdata / "postmaster.pid").write_text(f"{os.getpid()}\n{server.pgdata}\n")
        server.start()
        assert await scalar(server.url(), "select 1") == 1
    finally:
        server.stop()


def test_embedded_postgres_data_dir_is_exclusive(embedded_postgres: EmbeddedPostgres) -> None:
    assert embedded_postgres.running
    with pytest.raises(RuntimeError, match="in use"):
        EmbeddedPostgres(embedded_postgres.data_dir).start()


# --- EmbeddedNats ----------------------------------------------------------------------


async def test_embedded_nats_jetstream_survives_restart(nats_server: EmbeddedNats) -> None:
    port = nats_server.port
    assert port not in (4222, 5432)
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="STACKTEST", subjects=["stacktest.>"])
        ack = await js.publish("stacktest.one", b"kept", headers={"Nats-Msg-Id": "m1"})
        assert ack.seq == 1
    finally:
        await nc.close()

    nats_server.stop()
    assert not nats_server.running
    assert refuses_connections(port)

    nats_server.start()
    assert nats_server.port == port
    assert nats_server.url == f"nats://127.0.0.1:{port}"
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        info = await js.stream_info("STACKTEST")
        assert info.state.messages == 1
        message = await js.get_msg("STACKTEST", 1)
        assert message.data == b"kept"
    finally:
        await nc.close()


def test_embedded_nats_remembers_its_port(tmp_path: Path) -> None:
    with EmbeddedNats(tmp_path / "nats") as first:
        port = first.port
    with EmbeddedNats(tmp_path / "nats") as second:
        assert second.port == port
        assert (tmp_path / "nats" / "nats.log").stat().st_size > 0


# --- the service fixtures --------------------------------------------------------------


async def test_database_url_is_a_private_migrated_database(
    database_url: str, pg_admin_url: str, migrated_template: str
) -> None:
    assert database_url.startswith("postgresql+asyncpg://")
    assert await scalar(database_url, "select count(*) from alembic_version") == 1
    name = await scalar(database_url, "select current_database()")
    assert isinstance(name, str) and name.startswith("mf_test_")
    assert name != migrated_template
    assert pg_admin_url.endswith("/postgres")


async def test_nats_url_has_jetstream(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        info = await nc.jetstream().account_info()
        assert info is not None
    finally:
        await nc.close()


# --- modelforge up ---------------------------------------------------------------------


def answers(url: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=5).status_code == 200:
                return True
        time.sleep(0.2)
    return False


def run_up_once(start_up: StartUp, data_dir: Path, access_log: bool = False) -> tuple[str, str]:
    """Start `up`, check it serves and stops cleanly; (what it said of the operator key,
    database URL)."""
    port = free_port()
    up = start_up(data_dir, port, args=["--access-log"] if access_log else [])
    key = up.wait_for(r"Operator key: (.+)", timeout_s=180).group(1)
    database_url = up.wait_for(r"Database: +(\S+)", timeout_s=5).group(1)
    up.wait_for(r"Press Ctrl-C to stop", timeout_s=5)
    stack_file = data_dir / "stack.json"
    info = json.loads(stack_file.read_text())
    assert info["api_url"] == f"http://127.0.0.1:{port}"
    assert info["nats_url"].startswith("nats://127.0.0.1:")
    assert info["operator_key_file"] == str((data_dir / "operator_api_key").resolve())
    # The database a second API or worker beside it takes (the README's TLS block does).
    assert info["database_url"] == database_url
    assert database_url.startswith("postgresql+asyncpg://")
    assert info["artifact_source_url"] == HUB_URL
    assert f"Models from:  {HUB_URL} (the Hugging Face Hub), set by {SOURCE_URL_ENV}" in up.output
    base = f"http://127.0.0.1:{port}"
    assert base in up.output
    assert f"{base}/docs" in up.output
    assert f"Dashboard:    {base}/ui " in up.output
    assert str(data_dir.resolve()) in up.output
    assert httpx.get(f"{base}/healthz", timeout=10).status_code == 200
    # Metrics are on by default, on the ports up printed.
    assert f"{base}/metrics (API), {info['worker_metrics_url']} (worker)" in up.output
    assert httpx.get(f"{base}/metrics", timeout=10).status_code == 200
    assert answers(info["worker_metrics_url"], timeout_s=60)  # the worker may still start
    # A change through the API reaches the worker's audit consumer, which counts it.
    operator_key = Path(info["operator_key_file"]).read_text().strip()
    created = httpx.post(
        f"{base}{TOKENS}", json={}, headers={ADMIN_HEADER: operator_key}, timeout=10
    )
    assert created.status_code == 201, created.text

    def audited() -> bool:
        text = httpx.get(info["worker_metrics_url"], timeout=5).text
        return 'modelforge_events_handled_total{consumer="audit"}' in text

    deadline = time.monotonic() + 30
    while not audited():
        assert time.monotonic() < deadline, "the worker's audit consumer never counted it"
        time.sleep(0.2)

    # A request's log line only with --access-log: by default the fleet's traffic would
    # bury the banner and the one-time key (it is on /metrics).
    logged = "modelforge.api.access [correlation_id="
    if access_log:
        assert "Access log:   on" in up.output
        up.wait_for(re.escape(logged) + rf".*\] POST {re.escape(TOKENS)} 201", timeout_s=10)
    else:
        assert "Access log:   off (--access-log turns it on" in up.output
        assert logged not in up.output, up.output

    tree = up.descendants()
    names = " ".join(" ".join(p.cmdline()) for p in tree)
    assert "cli.main api" in names and "cli.main worker" in names
    assert "postgres" in names and "nats-server" in names

    assert up.interrupt() == 0, up.output
    _, alive = psutil.wait_procs(tree, timeout=10)
    assert not alive, f"left running: {alive}"
    assert refuses_connections(port)
    assert not stack_file.exists()  # clients of a stopped stack are told so
    return key, database_url


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_modelforge_up_runs_stops_and_keeps_data(
    start_up: StartUp, pg_tmp_path: Path
) -> None:
    data_dir = pg_tmp_path / "data"
    shown, database_url = run_up_once(start_up, data_dir)
    key_file = data_dir / "operator_api_key"
    key = key_file.read_text().strip()
    # Shown once, on the run that created it, with where it is kept.
    assert shown.startswith(f"{key}  (new; shown this once, kept in {key_file.resolve()}")
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert data_dir.stat().st_mode & 0o077 in (0, 0o001)  # private; root adds search only
    stamp = (key_file.read_bytes(), key_file.stat().st_mtime_ns)

    # Leave a mark in the database between runs, through a server started on the same
    # data directory (as `up` does), to prove the second run sees the same data.
    with EmbeddedPostgres(data_dir / "postgres") as server:
        await execute(server.url("modelforge"), "create table e2e_mark (v int)")

    second_shown, second_database_url = run_up_once(start_up, data_dir, access_log=True)
    assert key not in second_shown and second_shown == f"in {key_file.resolve()}"
    assert (key_file.read_bytes(), key_file.stat().st_mtime_ns) == stamp
    assert second_database_url == database_url  # the remembered port
    with EmbeddedPostgres(data_dir / "postgres") as server:
        url = server.url("modelforge")
        assert await scalar(url, "select count(*) from e2e_mark") == 0
        assert await scalar(url, "select count(*) from alembic_version") == 1


def test_modelforge_up_refuses_a_busy_port(start_up: StartUp, tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        up = start_up(tmp_path / "data", port)
        assert up.finish(timeout_s=60) == 1
    assert f"port {port}" in up.output and "already in use" in up.output, up.output
    assert not (tmp_path / "data").exists()  # failed before starting anything


# The driver each command would otherwise fail on only at its first connection (a
# `psycopg` import error, repeated by every supervised process until the crash loop).
OTHER_DRIVERS = ["postgresql://modelforge:hunter2@db:5432/db", "postgresql+psycopg://db/db"]


@pytest.mark.fast
@pytest.mark.parametrize("command", ["api", "worker", "migrate", "up"])
@pytest.mark.parametrize("url", OTHER_DRIVERS)
def test_a_database_url_of_another_driver_is_refused_in_one_line(
    command: str, url: str, tmp_path: Path
) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MODELFORGE_")},
        "MODELFORGE_DATABASE_URL": url,
        "MODELFORGE_NATS_URL": "nats://127.0.0.1:9",
        "MODELFORGE_DATA_DIR": str(tmp_path / "data"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", command],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done
    [line] = done.stderr.splitlines()
    scheme = url.split("://")[0]
    assert line == (
        f"modelforge {command}: MODELFORGE_DATABASE_URL: must be "
        "postgresql+asyncpg://user:password@host:5432/db (the asyncpg driver, the one "
        f"ModelForge uses); this URL has {scheme}://..."
    )
    assert "hunter2" not in done.stdout + done.stderr
    assert not (tmp_path / "data").exists()  # up started nothing
