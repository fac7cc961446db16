"""`modelforge admin --help` as a newcomer reads it: every command says in one line what
it does, a flag is shown as a flag (no `<bool>` beside it), a `-f` body's shape comes with
an example that the body's wire model accepts, and `--version` answers."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib.metadata import version
from typing import Any

import pytest
import typer
from pydantic import TypeAdapter
from typer._click.core import Command
from typer.core import TyperOption

from cli.admin.app import build_app
from cli.admin.bodies import EXAMPLE_WIDTH
from cli.admin.help import commands, quiet_flags
from schemas.deployments import DeploymentCreate
from schemas.runtime import ProfileCreate, RuntimeJobCreate
from schemas.services import ServiceCreate, ServiceRollout
from tests.cli_support import REPO

pytestmark = pytest.mark.fast

# Each command that reads a body with -f, and the wire model its example must satisfy.
BODIES: dict[tuple[str, ...], Any] = {
    ("deployments", "create"): DeploymentCreate,
    ("runtime", "profiles", "create"): ProfileCreate,
    ("runtime", "probes", "create"): RuntimeJobCreate,
    ("services", "create"): ServiceCreate,
    ("services", "rollout", "start"): ServiceRollout,
}
EXAMPLE = re.compile(r"```json\n(?P<body>.*?)\n```", re.S)


def every_command() -> list[tuple[tuple[str, ...], Command]]:
    return list(commands(quiet_flags(typer.main.get_command(build_app()))))


def render_help(path: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> str:
    from cli.admin.app import run

    assert run([*path, "--help"]) == 0
    return capsys.readouterr().out


def test_every_command_has_a_one_line_description() -> None:
    found = every_command()
    assert len(found) > 50, "the walk reached every group"
    missing, wrapped = [], []
    for path, command in found:
        first = (command.help or "").strip().split("\n\n")[0]
        if not first:
            missing.append(" ".join(path))
        elif "\n" in first or len(first) > 100:
            wrapped.append(" ".join(path))
    assert not missing, f"no description: {missing}"
    assert not wrapped, f"a description over more than one line: {wrapped}"


def test_no_flag_shows_a_value_type_and_no_help_is_hard_wrapped(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    for path, _ in every_command():
        shown = render_help(path, capsys)
        assert "<bool>" not in shown, " ".join(path)
        assert "Usage:" in shown


def test_every_body_has_its_shape_and_an_example_the_api_accepts() -> None:
    by_path = dict(every_command())
    with_file = {
        path
        for path, command in by_path.items()
        if any("--file" in getattr(p, "opts", []) for p in command.params)
    }
    assert with_file == set(BODIES), "a new -f command needs its example here"
    for path, model in BODIES.items():
        epilog = by_path[path].epilog or ""
        match = EXAMPLE.search(epilog)
        assert match is not None, f"{' '.join(path)}: no ```json example in its epilog"
        TypeAdapter(model).validate_python(json.loads(match["body"]))


def modelforge(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`modelforge ARGV` as a shell runs it, with these environment variables more."""
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *argv],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("argv", [["--version"], ["admin", "--version"]])
def test_version_is_the_package_metadata(argv: list[str]) -> None:
    result = modelforge(*argv)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"modelforge {version('modelforge')}"


def test_a_short_id_is_said_to_be_one(capsys: pytest.CaptureFixture[str]) -> None:
    from cli.admin.app import run

    # Parsed before anything is sent: no API is needed to say it.
    assert run(["nodes", "get", "1c2d023e"]) == 2
    assert "'1c2d023e' is a short id: give the whole id" in capsys.readouterr().err
    assert run(["jobs", "list", "--node", "not-an-id"]) == 2
    assert "'not-an-id' is not an id" in capsys.readouterr().err


def test_every_option_says_what_it_is() -> None:
    missing = [
        f"{' '.join(path)} {param.opts[0]}"
        for path, command in every_command()
        for param in command.params
        if isinstance(param, TyperOption) and not (param.help or "").strip()
    ]
    assert not missing, f"an option without help: {missing}"


def test_every_body_example_fits_an_80_column_help(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A code block is never reflowed: an example line longer than the help's width was
    folded in the middle of a JSON string."""
    monkeypatch.setenv("COLUMNS", "80")
    by_path = dict(every_command())
    for path in BODIES:
        match = EXAMPLE.search(by_path[path].epilog or "")
        assert match is not None
        shown = [line.strip() for line in render_help(path, capsys).splitlines()]
        for line in match["body"].splitlines():
            assert len(line) <= EXAMPLE_WIDTH, line
            assert line.strip() in shown, f"{' '.join(path)}: {line!r} folded"


def test_the_top_level_help_fits_80_columns() -> None:
    for argv in (["--help"], ["up", "--help"]):
        result = modelforge(*argv, COLUMNS="80")
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert all(len(line) <= 80 for line in lines), result.stdout
        assert "Imports are local" not in result.stdout, "a developer's note is no help"
        assert lines[2], f"{argv}: no description"
    assert "MODELFORGE_PORT" in result.stdout and "--access-log" in result.stdout
