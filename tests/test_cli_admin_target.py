"""Where `modelforge admin` finds the API and the operator key, and what it says when it
cannot use them.

The key: MODELFORGE_OPERATOR_API_KEY first; then the key file the running `up` names in
its stack file; then the file `up` keeps the key in (`.modelforge/operator_api_key`, or
under MODELFORGE_DATA_DIR), which is found with no stack file at all (an explicit
--api-url, an `up` that was killed). Never from the command line
(tests/test_cli_admin.py: test_the_key_is_never_an_argument).

The key files here are written by `up`'s own code (stack/up.py operator_key) and the
stack file by schemas/stack.py's writer, and the successful commands run against a real
API holding that key. The ones that fail do so before any request, in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli.admin.client import KEY_FILE
from schemas.admin import NodeList
from schemas.stack import STACK_FILE, StackInfo, write_stack_info
from stack import up
from stack.settings import StackSettings
from tests.api_server import OPERATOR_KEY, ApiFactory, RunningApi
from tests.cli_support import environment, failed, ok, run_command

# A closed port: the commands that must fail before any request never reach it.
NOWHERE = "http://127.0.0.1:9"


def generated_key(data_dir: Path) -> str:
    """The key `modelforge up` generates on its first run, in the file it keeps it in."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = up.operator_key(StackSettings(operator_api_key=None), data_dir)
    assert key.created and key.path == data_dir / KEY_FILE
    return key.value


def api_for(api_factory: ApiFactory, key: str) -> RunningApi:
    return api_factory(operator_api_key=key, pipeline=False)


def listed(result: subprocess.CompletedProcess[str]) -> NodeList:
    return NodeList.model_validate_json(ok(result))


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """A failure before any request: exit 1, one line, no traceback."""
    assert result.returncode == 1, f"rc {result.returncode}: {result.stdout}{result.stderr}"
    assert result.stdout == "" and "Traceback" not in result.stderr, result.stderr
    line = result.stderr.strip()
    assert line.startswith("error: ") and "\n" not in line, result.stderr
    return line


@pytest.mark.fast
def test_the_cli_reads_the_file_up_writes() -> None:
    assert up.KEY_FILE == KEY_FILE


def test_the_default_key_file_is_read_without_a_stack_file(
    api_factory: ApiFactory, tmp_path: Path
) -> None:
    """`.modelforge/operator_api_key` in the directory the operator runs it from: no
    MODELFORGE_DATA_DIR, no stack file, the URL from --api-url."""
    key = generated_key(tmp_path / ".modelforge")
    api = api_for(api_factory, key)
    assert not (tmp_path / ".modelforge" / STACK_FILE).exists()
    env = environment(None, None, tmp_path / "unused")
    del env["MODELFORGE_DATA_DIR"]
    result = run_command(
        "--api-url", api.base_url, "nodes", "list", "--json", env=env, cwd=tmp_path
    )
    assert listed(result).items == []
    # From another directory there is no key: said, with where it was looked for.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = run_command("--api-url", api.base_url, "nodes", "list", env=env, cwd=elsewhere)
    line = one_line(result)
    assert "MODELFORGE_OPERATOR_API_KEY" in line and f".modelforge/{KEY_FILE}" in line, line


def test_the_data_dirs_key_file_is_read_without_a_stack_file(
    api_factory: ApiFactory, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    key = generated_key(data_dir)
    api = api_for(api_factory, key)
    result = run_command("nodes", "list", "--json", env=environment(api.base_url, None, data_dir))
    assert listed(result).items == []
    # A stack file left by an `up` that was killed: not trusted for the URL, while the
    # key file beside it is still that data dir's key.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    info = StackInfo(
        api_url=NOWHERE,
        nats_url="nats://127.0.0.1:9",
        operator_key_file=str(data_dir / KEY_FILE),
        data_dir=str(data_dir),
        pid=dead.pid,
    )
    write_stack_info(info)
    result = run_command("nodes", "list", "--json", env=environment(api.base_url, None, data_dir))
    assert listed(result).items == []
    stale = one_line(run_command("nodes", "list", env=environment(None, None, data_dir)))
    assert "stale" in stale and "MODELFORGE_API_URL" in stale, stale


def test_the_environment_key_wins_over_the_file(api_factory: ApiFactory, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    in_file = generated_key(data_dir)
    api = api_for(api_factory, OPERATOR_KEY)
    # The file's key is not the API's: the environment's is used, and it is.
    result = run_command(
        "nodes", "list", "--json", env=environment(api.base_url, OPERATOR_KEY, data_dir)
    )
    assert listed(result).items == []
    # And the other way round: a wrong key in the environment is not mended by the file.
    api = api_for(api_factory, in_file)
    wrong = run_command(
        "nodes", "list", env=environment(api.base_url, "not-the-operator-key", data_dir)
    )
    failed(wrong, "admin_token_invalid")
    assert "not-the-operator-key" not in wrong.stderr and in_file not in wrong.stderr
    # An empty variable is no key: the file is read.
    result = run_command("nodes", "list", "--json", env=environment(api.base_url, "", data_dir))
    assert listed(result).items == []


def test_the_running_ups_stack_file_gives_the_url_and_the_key(
    api_factory: ApiFactory, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    # The key file the stack file names, wherever it is (here not in the data dir).
    elsewhere = tmp_path / "keys"
    key = generated_key(elsewhere)
    data_dir.mkdir(mode=0o700)
    api = api_for(api_factory, key)
    write_stack_info(
        StackInfo(
            api_url=api.base_url,
            nats_url="nats://127.0.0.1:9",
            operator_key_file=str(elsewhere / KEY_FILE),
            data_dir=str(data_dir),
            pid=os.getpid(),  # running: this test
        )
    )
    result = run_command("nodes", "list", "--json", env=environment(None, None, data_dir))
    assert listed(result).items == []


@pytest.mark.fast
def test_a_key_that_cannot_be_used_is_said_in_one_line(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o700)
    env = environment(NOWHERE, None, data_dir)
    # None anywhere.
    line = one_line(run_command("nodes", "list", env=env))
    assert "MODELFORGE_OPERATOR_API_KEY" in line and str(data_dir / KEY_FILE) in line, line
    # Empty.
    (data_dir / KEY_FILE).write_text("\n")
    line = one_line(run_command("nodes", "list", env=env))
    assert f"the operator key file {data_dir / KEY_FILE} is empty" in line, line
    # Unreadable (a directory where the file should be; root reads any mode).
    (data_dir / KEY_FILE).unlink()
    (data_dir / KEY_FILE).mkdir()
    line = one_line(run_command("nodes", "list", env=env))
    assert "cannot read the operator key file" in line, line
    # A running `up` that took its key from its environment: the file is not its key.
    (data_dir / KEY_FILE).rmdir()
    generated_key(data_dir)
    write_stack_info(
        StackInfo(
            api_url=NOWHERE,
            nats_url="nats://127.0.0.1:9",
            operator_key_file=None,
            data_dir=str(data_dir),
            pid=os.getpid(),
        )
    )
    line = one_line(run_command("nodes", "list", env=environment(None, None, data_dir)))
    assert "MODELFORGE_OPERATOR_API_KEY" in line, line


@pytest.mark.fast
@pytest.mark.parametrize("url", [NOWHERE, "not-a-url", "ftp://127.0.0.1:9"])
def test_an_api_that_cannot_be_reached_is_said_in_one_line(tmp_path: Path, url: str) -> None:
    for watch in ((), ("-w",)):
        result = run_command(
            "--api-url", url, "nodes", "list", *watch, env=environment(None, "k", tmp_path)
        )
        line = one_line(result)
        assert line.startswith(f"error: cannot reach the API at {url} ("), line


@pytest.mark.fast
def test_a_url_that_is_not_one_is_said_in_one_line(tmp_path: Path) -> None:
    env = environment("http://cp.internal:port", "k", tmp_path)
    line = one_line(run_command("nodes", "list", env=env))
    assert line.startswith("error: the API URL 'http://cp.internal:port' is not a URL"), line
