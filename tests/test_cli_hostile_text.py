"""What a node or an operator wrote reaches the operator's terminal as text, never as
Rich markup or a control sequence: `modelforge admin` on a colour terminal (a
pseudo-terminal) against a real API, with a node whose agent reported hostile names.

The API refuses control characters on the way in (schemas/base.py: Text), so markup,
bidirectional overrides and line separators are all a node can send today; an ESC or a
C1 control can still sit in a row written before that rule or by another writer, so
the tests that need one write it into the row directly, as such a writer would have."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from io import StringIO
from typing import Any

import pytest
from pydantic import BaseModel
from rich.console import Console

from cli.admin.output import Column, Format, Output, styled
from cli.terminal import literal, visible
from schemas.admin import NodeDetail
from schemas.protocol import ARTIFACT_JOB_FAIL
from tests.admin_helpers import beat, patch_node
from tests.api_server import RunningApi
from tests.artifact_flows import claimed, created, fence, offer_roots
from tests.cli_support import Admin, Running, ok
from tests.flows import INVENTORY, EnrolledNode, enroll, gpu, inventory_body
from tests.services import db_fetch, run_async

pytest_plugins = ["tests.cli_fixtures"]

# What an agent may report (schemas/base.py: Text admits all of it).
HOSTNAME = "[green]trusted-host[/green][conceal]hidden-suffix"
DISPLAY_NAME = "[blink]x[/blink] [link=https://evil.example/]docs[/link]"
GPU_NAME = "[bold red]NVIDIA H200[/] \u202eevil\u202c"
HOST_OS = "Linux\u2028[reverse]spoofed"
FAILURE_DETAIL = "[blink]disk full[/blink] \u2066txt.exe\u2069"
# What only a row written otherwise may hold: an erase-screen, an OSC 8 hyperlink, a C1
# CSI and a bell.
STORED_HOSTNAME = "evil\x1b[2J\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\"
STORED_LABELS = {"zone\x9b31m": "a\x07b"}
STORED_FAILURE = "[red]oom\x1b[5m\u2066"

# Each as the terminal must show it: markup as written, every hidden character spelled.
SHOWN_GPU_NAME = "[bold red]NVIDIA H200[/] \\u202eevil\\u202c"
SHOWN_HOST_OS = "Linux\\u2028[reverse]spoofed"
SHOWN_FAILURE_DETAIL = "[blink]disk full[/blink] \\u2066txt.exe\\u2069"
SHOWN_STORED_HOSTNAME = "evil\\x1b[2J\\x1b]8;;https://evil.example/\\x1b\\click\\x1b]8;;\\x1b\\"
SHOWN_STORED_LABELS = "zone\\x9b31m=a\\x07b"
SHOWN_STORED_FAILURE = "[red]oom\\x1b[5m\\u2066"

# Rich's own colours (SGR); any other ESC on the terminal came from data.
SGR = re.compile(r"\x1b\[[0-9;]*m")
HIDDEN = ("\x1b", "\x9b", "\x07", "\u202e", "\u202c", "\u2066", "\u2069", "\u2028")


def on_terminal(output: str) -> str:
    """What the terminal got, with Rich's colours taken out: it must have been coloured
    (else this proves nothing), and hold no other escape and no hidden character."""
    assert SGR.search(output), f"not coloured: {output!r}"
    text = SGR.sub("", output)
    for hidden in HIDDEN:
        assert hidden not in text, f"{hidden!r} reached the terminal: {text!r}"
    return text


def hostile_node(client: Any, api: RunningApi) -> EnrolledNode:
    """Enrolled with the operator's hostile display name, then the agent's hostile
    hostname, OS and GPU name through its inventory, and a heartbeat."""
    node = enroll(client, api, HOSTNAME, display_name=DISPLAY_NAME, labels={"rack": "a1"})
    body = inventory_body(node.node_id, 1, gpus=[gpu(0, name=GPU_NAME)], hostname=HOSTNAME)
    body["host"]["os"] = HOST_OS
    answer = client.put(INVENTORY, json=body, headers=node.headers)
    assert answer.status_code == 200, answer.text
    assert beat(client, node).status_code == 200
    return node


def rewrite(api: RunningApi, sql: str, *args: object) -> None:
    """A row as a writer other than today's API left it."""
    rows = run_async(lambda: db_fetch(api.settings.database_url, sql + " RETURNING id", *args))
    assert len(rows) == 1, rows


def test_nodes_list_and_get_show_what_the_agent_reported_literally(
    tty_admin: Admin, api: RunningApi
) -> None:
    with api.client() as client:
        node = hostile_node(client, api)
    listed = on_terminal(ok(tty_admin("nodes", "list")))
    assert HOSTNAME in listed and DISPLAY_NAME in listed and node.node_id[:8] in listed
    shown = on_terminal(ok(tty_admin("nodes", "get", node.node_id)))
    for text in (HOSTNAME, DISPLAY_NAME, SHOWN_GPU_NAME, SHOWN_HOST_OS, "rack=a1"):
        assert text in shown, text
    # --json stays the API's exact answer, hidden characters and all (JSON's escapes only).
    exact = NodeDetail.model_validate_json(ok(tty_admin("nodes", "get", node.node_id, "--json")))
    assert exact.hostname == HOSTNAME and exact.gpus[0].name == GPU_NAME


def test_control_characters_in_stored_rows_are_shown_not_sent(
    tty_admin: Admin, api: RunningApi
) -> None:
    with api.client() as client:
        node = hostile_node(client, api)
        offer_roots(client, node, ["/srv/models"], sequence=2, hostname=HOSTNAME)
        job_id = created(client, api, node)
    rewrite(
        api,
        "UPDATE nodes SET hostname = $1, labels = $2::jsonb WHERE id = $3",
        STORED_HOSTNAME,
        json.dumps(STORED_LABELS),
        uuid.UUID(node.node_id),
    )
    rewrite(
        api,
        "UPDATE jobs SET failure_code = $1, failure_retryable = true WHERE id = $2",
        STORED_FAILURE,
        uuid.UUID(job_id),
    )
    listed = on_terminal(ok(tty_admin("nodes", "list")))
    assert SHOWN_STORED_HOSTNAME in listed and SHOWN_STORED_LABELS in listed
    shown = on_terminal(ok(tty_admin("nodes", "get", node.node_id)))
    assert SHOWN_STORED_HOSTNAME in shown and SHOWN_STORED_LABELS in shown
    jobs = on_terminal(ok(tty_admin("jobs", "list")))
    assert job_id[:8] in jobs and SHOWN_STORED_FAILURE in jobs


def test_jobs_show_a_failure_the_node_reported_literally(tty_admin: Admin, api: RunningApi) -> None:
    with api.client() as client:
        node = hostile_node(client, api)
        offer_roots(client, node, ["/srv/models"], sequence=2, hostname=HOSTNAME)
        job_id = created(client, api, node, max_attempts=1)
        lease = fence(claimed(client, node))
        answer = client.post(
            ARTIFACT_JOB_FAIL.format(job_id=job_id),
            json={"lease": lease, "code": "internal", "retryable": False, "detail": FAILURE_DETAIL},
            headers=node.headers,
        )
        assert answer.status_code == 200, answer.text
    jobs = on_terminal(ok(tty_admin("jobs", "list")))
    assert job_id[:8] in jobs and "internal" in jobs
    shown = on_terminal(ok(tty_admin("jobs", "get", job_id)))
    assert f"internal: {SHOWN_FAILURE_DETAIL}" in shown


def test_nodes_watch_shows_the_hostname_literally(
    tty_background: Callable[..., Running], api: RunningApi
) -> None:
    with api.client() as client:
        node = hostile_node(client, api)
        api.settle()
        watch = tty_background("nodes", "watch", node.node_id, "--count", "1")
        # The first view (the node's row), drawn once the stream is subscribed.
        first = on_terminal(watch.line(lambda line: node.node_id[:8] in line))
        assert HOSTNAME in first and DISPLAY_NAME in first
        assert patch_node(client, api, node.node_id, enabled=False).status_code == 200
        event = on_terminal(watch.line(lambda line: "node.disabled" in line))
        assert node.node_id[:8] in event and HOSTNAME in event
        assert watch.process.wait(timeout=60) == 0


# The one place: the sanitizer, and the renderers that go through it ----------------------


@pytest.mark.fast
@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("plain host-1", "plain host-1"),
        ("Grüße 東京 ✓", "Grüße 東京 ✓"),
        ("[green]x[/green]", "[green]x[/green]"),
        ("a\x1b[2Jb", "a\\x1b[2Jb"),
        (
            "\x1b]8;;https://e.example/\x1b\\x\x1b]8;;\x1b\\",
            "\\x1b]8;;https://e.example/\\x1b\\x\\x1b]8;;\\x1b\\",
        ),
        ("nul\x00 bell\x07 del\x7f", "nul\\x00 bell\\x07 del\\x7f"),
        ("two\nlines\r\ttab", "two\\nlines\\r\\ttab"),
        ("csi\x9b31m nel\x85", "csi\\x9b31m nel\\x85"),
        ("\u202a\u202b\u202c\u202d\u202e", "\\u202a\\u202b\\u202c\\u202d\\u202e"),
        (
            "\u2066\u2067\u2068\u2069 \u200e\u200f\u061c",
            "\\u2066\\u2067\\u2068\\u2069 \\u200e\\u200f\\u061c",
        ),
        ("line\u2028para\u2029", "line\\u2028para\\u2029"),
        ("zero\u200bwidth\ufeff", "zero\\u200bwidth\\ufeff"),
        ("tag\U000e0041", "tag\\U000e0041"),
        ("lone\ud800", "lone\\ud800"),
    ],
)
def test_visible_spells_every_hidden_character(raw: str, shown: str) -> None:
    assert visible(raw) == shown


def _terminal() -> tuple[Console, StringIO]:
    buffer = StringIO()
    console = Console(
        file=buffer, force_terminal=True, color_system="truecolor", width=300, highlight=False
    )
    return console, buffer


@pytest.mark.fast
def test_literal_is_never_markup_and_marks_what_it_spelled() -> None:
    console, buffer = _terminal()
    console.print(literal("[link=https://e.example/]x[/link]\x1b[2J", style="green"))
    # The spelled ESC set off (reversed) from the text around it.
    assert "\x1b[7;32m\\x1b\x1b[0m" in buffer.getvalue()
    text = on_terminal(buffer.getvalue())
    assert text.strip() == "[link=https://e.example/]x[/link]\\x1b[2J"


class Row(BaseModel):
    host: str
    state: str
    gpu: str


@pytest.mark.fast
def test_every_renderer_of_output_prints_data_literally() -> None:
    console, buffer = _terminal()
    out = Output(Format.TABLE, console=console)
    rows = [Row(host=HOSTNAME, state="online", gpu=GPU_NAME)]
    columns: list[Column[Row]] = [
        Column("HOST", lambda r: r.host),
        Column("STATE", lambda r: r.state, styled=True),
        Column("GPU", lambda r: r.gpu),
    ]
    out.rows(rows, columns, title=STORED_FAILURE)
    out.detail(rows[0], [("hostname", STORED_HOSTNAME), ("os", HOST_OS)])
    out.line("at ", STORED_HOSTNAME, " ", styled("online"))
    out.note(DISPLAY_NAME, style="yellow")
    text = on_terminal(buffer.getvalue())
    for shown in (HOSTNAME, SHOWN_GPU_NAME, SHOWN_STORED_FAILURE, SHOWN_STORED_HOSTNAME):
        assert shown in text, shown
    assert SHOWN_HOST_OS in text and DISPLAY_NAME in text
    assert f"at {SHOWN_STORED_HOSTNAME} online" in text


@pytest.mark.fast
def test_an_error_line_shows_what_it_echoes(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure's one line names what it could not reach or was refused, as given: a
    URL here (a refusal's message from the server the same way), spelled out."""
    from cli.admin.app import run

    monkeypatch.setenv("MODELFORGE_OPERATOR_API_KEY", "key")
    # Nothing listens on port 9 (discard): refused at once.
    assert run(["--api-url", "http://127.0.0.1:9/\u202eevil\u2066", "nodes", "list"]) == 1
    line = capsys.readouterr().err
    assert line.startswith("error: cannot reach the API at http://127.0.0.1:9/\\u202eevil\\u2066")
    assert "\u202e" not in line and "\u2066" not in line
