"""What an operator can fix is one line on stderr and a status, never a traceback; and
the tools find `modelforge up` through its stack file, never through a default port."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from schemas.stack import StackFileError, StackInfo, read_stack_info, write_stack_info
from tests.agent.harness import REPO, clean_env
from tests.api_server import OPERATOR_KEY, ApiFactory
from tests.artifact_flows import ROOT, node_with_roots
from tests.cli_support import environment, failed, run_command


def modelforge(*argv: str, timeout_s: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *argv],
        cwd=REPO,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def info(directory: Path, pid: int, nats_url: str = "nats://127.0.0.1:9") -> StackInfo:
    return StackInfo(
        api_url="http://127.0.0.1:9",
        nats_url=nats_url,
        operator_key_file=None,
        data_dir=str(directory),
        pid=pid,
    )


def test_missing_settings_are_named(tmp_path: Path) -> None:
    result = modelforge("api")
    assert result.returncode == 2
    assert one_line(result) == (
        "modelforge api: MODELFORGE_DATABASE_URL is required; MODELFORGE_NATS_URL is required"
    )
    result = modelforge("worker", MODELFORGE_DATABASE_URL="postgresql+asyncpg://x/y")
    assert result.returncode == 2
    assert one_line(result) == "modelforge worker: MODELFORGE_NATS_URL is required"


def test_events_tail_without_a_stack_says_what_to_do(tmp_path: Path) -> None:
    result = modelforge("events", "tail", MODELFORGE_DATA_DIR=str(tmp_path))
    assert result.returncode == 2
    line = one_line(result)
    assert f"no {tmp_path}/stack.json" in line and "modelforge up" in line


def test_events_tail_uses_the_stack_file_and_reports_an_unreachable_nats(
    tmp_path: Path,
) -> None:
    # A stack file of a live process (this one) whose NATS does not answer.
    write_stack_info(info(tmp_path, os.getpid()))
    result = modelforge("events", "tail", MODELFORGE_DATA_DIR=str(tmp_path), timeout_s=60)
    assert result.returncode == 1
    assert one_line(result).startswith("modelforge events: NATS at nats://127.0.0.1:9: ")


def test_a_stack_file_left_by_a_killed_up_is_stale(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    write_stack_info(info(tmp_path, int(dead.stdout)))
    with pytest.raises(StackFileError, match="is stale"):
        read_stack_info(tmp_path)
    write_stack_info(info(tmp_path, os.getpid()))
    assert read_stack_info(tmp_path).pid == os.getpid()


def test_an_unknown_event_type_is_a_usage_error(tmp_path: Path) -> None:
    result = modelforge("events", "tail", "--type", "node.nope", "--nats-url", "nats://x:9")
    assert result.returncode == 2
    assert one_line(result).startswith("modelforge events: unknown event type 'node.nope'")


# `modelforge admin`: what a wrong URL meets, said as what to do -------------------------


Answer = tuple[int, str, bytes]


def _handler(answer: Answer) -> type[BaseHTTPRequestHandler]:
    """Another HTTP server (a dashboard, a proxy's page, another API): it answers
    `answer`, without ModelForge's error envelope or correlation id."""

    class Foreign(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, kind, body = answer
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    return Foreign


@pytest.fixture
def foreign() -> Iterator[Callable[[Answer], str]]:
    servers: list[ThreadingHTTPServer] = []

    def serve(answer: Answer) -> str:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(answer))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.mark.fast
@pytest.mark.parametrize(
    ("answer", "said"),
    [
        ((404, "text/html", b"<h1>Not Found</h1>"), "404 Not Found (text/html)"),
        ((200, "text/html", b"<html>a dashboard</html>"), "200 OK (text/html)"),
        ((200, "application/json", b'{"items": []}'), "200 OK (application/json)"),
        ((401, "application/json", b'{"detail": "no"}'), "401 Unauthorized (application/json)"),
    ],
)
def test_a_server_that_is_not_modelforge_is_said_to_be_so(
    foreign: Callable[[Answer], str], tmp_path: Path, answer: Answer, said: str
) -> None:
    url = foreign(answer)
    for watch in ((), ("-w",)):
        result = run_command(
            "--api-url", url, "nodes", "list", *watch, env=environment(None, "k", tmp_path)
        )
        assert result.returncode == 1, result.stdout
        line = one_line(result)
        assert line.startswith(f"error: {url} does not look like a ModelForge API"), line
        assert said in line and "MODELFORGE_API_URL" in line, line


def test_https_against_the_http_api_says_to_use_http(
    api_factory: ApiFactory, tmp_path: Path
) -> None:
    api = api_factory()
    https = api.base_url.replace("http://", "https://", 1)
    env = environment(None, OPERATOR_KEY, tmp_path)
    for watch in ((), ("-w",)):
        line = one_line(run_command("--api-url", https, "nodes", "list", *watch, env=env))
        assert line == (
            f"error: the server at {https} speaks plain HTTP, not HTTPS; use {api.base_url}"
        ), line


def test_an_unreachable_artifact_source_shows_the_apis_message(
    api_factory: ApiFactory, tmp_path: Path
) -> None:
    url = "http://127.0.0.1:9"
    api = api_factory(artifact_source_url=url)
    with api.client() as client:
        node = node_with_roots(client, api)
    result = run_command(
        *("jobs", "create", "--node", node.node_id, "--root", ROOT),
        *("--repository", "acme/tiny-model", "--pattern", "*.gguf"),
        env=environment(api.base_url, OPERATOR_KEY, tmp_path),
    )
    line = failed(result, "source_unavailable").string
    # The API's own message: which source, and the variable that chose it.
    assert url in line and "MODELFORGE_ARTIFACT_SOURCE_URL" in line, line
