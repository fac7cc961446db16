"""`modelforge admin` fits the operator's terminal: on a pseudo-terminal 80 and 200
columns wide, against a real API holding long names, no line is wider than the terminal
and no cell is split over lines (each row of a table is one line, starting with its
short id); `-o wide` shows whole ids and ISO times; `-o json` is --json.

The table builder itself (cli/admin/tables.py) is also driven directly, over widths and
values no fleet would hold, for the same two properties."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from rich.cells import cell_len
from rich.console import Console

from cli.admin.audit import AUDIT_COLUMNS
from cli.admin.cells import ago, iso, label
from cli.admin.deployments import DEPLOYMENT_COLUMNS, detail_fields
from cli.admin.output import Column, Format, Output, fields_of
from cli.admin.services import SERVICE_COLUMNS
from schemas.admin import AuditRecord
from schemas.deployments import DeploymentView
from schemas.protocol import NODES, SERVICE_CLIENTS
from schemas.services import ServiceView
from tests.admin_helpers import beat
from tests.api_server import RunningApi
from tests.artifact_flows import ROOT, created
from tests.cli_support import Admin, ok
from tests.deployment_flows import create_deployment, deployment_body
from tests.flows import INVENTORY, TELEMETRY, enroll, gpu, inventory_body, telemetry_body
from tests.runtime_flows import create_profile, environment_id, ready_node

pytest_plugins = ["tests.cli_fixtures"]

HOSTNAME = "gpu-worker-with-a-rather-long-hostname-017.eu-west-4.cluster.internal"
DISPLAY_NAME = "the long display name an operator gave this node"
LABELS = {"rack": "a1-row-7", "zone": "europe-west-4-b", "pool": "services-and-batch"}
NOTE = "for the new rack in the second hall, row seven, installed by the night shift"
CLIENT = "a-service-client-with-a-long-name-for-the-planner"
MODEL = "a-served-model-with-a-name-as-long-as-some-are"
SGR = re.compile(r"\x1b\[[0-9;]*m")
SHORT_ROW = re.compile(r"^[0-9a-f]{8}  ")
ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


def plain(output: str) -> list[str]:
    return SGR.sub("", output).splitlines()


def fits(lines: list[str], width: int) -> None:
    for line in lines:
        assert cell_len(line) <= width, f"{cell_len(line)} > {width}: {line!r}"


def rows_of(lines: list[str], header: str) -> list[str]:
    """The rows under the table whose header starts with `header`, to its end."""
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        rows.append(line)
    return rows


def within(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s"
        time.sleep(0.1)


def fleet(api: RunningApi) -> dict[str, str]:
    """A node with long names, two GPUs and telemetry, an artifact job on it, a token
    with a long note, a service client with a long name."""
    with api.client() as client:
        node = enroll(client, api, HOSTNAME, display_name=DISPLAY_NAME, labels=LABELS, note=NOTE)
        gpus = [gpu(0), gpu(1)]
        body = inventory_body(node.node_id, 1, gpus=gpus, hostname=HOSTNAME)
        body["host"]["artifact_roots"] = [ROOT]
        assert client.put(INVENTORY, json=body, headers=node.headers).status_code == 200
        assert beat(client, node).status_code == 200
        sample = telemetry_body(node.node_id, 1, gpu_uuids=[g["uuid"] for g in gpus])
        assert client.put(TELEMETRY, json=sample, headers=node.headers).status_code == 200
        job = created(client, api, node)
        answer = client.post(
            SERVICE_CLIENTS,
            json={
                "name": CLIENT,
                "models": ["smol-chat-model", "another-model"],
                "roles": ["planner"],
            },
            headers=api.admin_headers,
        )
        assert answer.status_code == 201, answer.text

        def telemetry_shown() -> bool:
            view = client.get(f"{NODES}/{node.node_id}", headers=api.admin_headers)
            return bool(view.json().get("telemetry"))

        within(telemetry_shown, 20, "telemetry in the node's view")
    return {"node": node.node_id, "job": job, "client": answer.json()["id"]}


@pytest.mark.parametrize("width", [80, 200])
def test_tables_fit_the_terminal_and_never_wrap_a_cell(
    tty_admin: Admin, api: RunningApi, width: int
) -> None:
    ids = fleet(api)
    for args, header, count in (
        (("nodes", "list"), "ID", 1),
        (("tokens", "list"), "ID", 1),
        (("jobs", "list"), "ID", 1),
        (("service-clients", "list"), "ID", 1),
    ):
        lines = plain(ok(tty_admin(*args, columns=width)))
        fits(lines, width)
        rows = rows_of(lines, header)
        assert len(rows) == count, (args, rows)
        assert all(SHORT_ROW.match(row) for row in rows), (args, rows)
        assert "ago" in rows[0], "times in a table are relative"
    nodes = plain(ok(tty_admin("nodes", "list", columns=width)))
    [row] = rows_of(nodes, "ID")
    assert row.startswith(ids["node"][:8]) and ids["node"] not in row
    if width == 200:
        assert HOSTNAME in row
    else:
        assert HOSTNAME[:8] in row and "…" in row and "online" in row

    shown = plain(ok(tty_admin("nodes", "get", ids["node"], columns=width)))
    fits(shown, width)
    assert any(line.startswith("Hostname:") for line in shown)
    assert any(line.startswith("Last Heartbeat:") and ISO.search(line) for line in shown)
    assert any(line.startswith("RAM:") and "used of" in line for line in shown)
    gpus = rows_of(shown, "INDEX")
    assert [g.split()[0] for g in gpus] == ["0", "1"], gpus
    assert all("50.0" in g and "300.0" in g for g in gpus), "telemetry beside each GPU"
    assert all("NVIDIA H200" in g and "present" in g for g in gpus), gpus


@pytest.mark.parametrize("width", [80, 200])
def test_a_deployments_endpoints_give_way_first_and_its_get_has_them(
    tty_admin: Admin, api: RunningApi, width: int
) -> None:
    """At 80 columns ENDPOINTS is the column left out (the state and the rest stay); at
    200 it is abbreviated beside them; -o wide and a `get` have the whole names."""
    with api.client() as client:
        node = ready_node(client, api, hostname="endpoints-host")
        profile = create_profile(client, api, name="endpoints-profile")
        body = deployment_body(node, profile["id"], environment_id(client, api), model=MODEL,
                               roles=["planner", "summarizer"],
                               endpoints=["chat", "completions", "embeddings"])  # fmt: skip
        made = create_deployment(client, api, body)
    lines = plain(ok(tty_admin("deployments", "list", columns=width)))
    fits(lines, width)
    [row] = rows_of(lines, "ID")
    assert SHORT_ROW.match(row) and "pending" in row, row
    header = next(line for line in lines if line.startswith("ID"))
    if width == 80:
        assert "ENDPOINTS" not in header and "chat" not in row, lines
        assert "STATE" in header and "NODE" in header
    else:
        assert "ENDPOINTS" in header and "chat,compl,embed" in row, lines
        assert MODEL in row
    wide = "\n".join(plain(ok(tty_admin("deployments", "list", "-o", "wide", columns=width))))
    assert "chat,completions,embeddings" in wide and "TOOL CALLS" in wide and "unknown" in wide
    shown = plain(ok(tty_admin("deployments", "get", made["id"], columns=width)))
    fits(shown, width)
    assert any(re.match(r"^Endpoints:\s+chat, completions, embeddings\s*$", line) for line in shown)
    assert any(re.match(r"^Tool Calls:\s+unknown\s*$", line) for line in shown), shown


def test_wide_has_whole_ids_and_iso_times_and_json_is_the_json_flag(
    tty_admin: Admin, admin: Admin, api: RunningApi
) -> None:
    ids = fleet(api)
    wide = plain(ok(tty_admin("nodes", "list", "-o", "wide", columns=80)))
    text = "\n".join(wide)
    assert ids["node"] in text and HOSTNAME in text and ISO.search(text)
    assert "ENROLLED" in text, "every column"
    jobs = "\n".join(plain(ok(tty_admin("jobs", "list", "-o", "wide", columns=80))))
    assert ids["job"] in jobs and ids["node"] in jobs
    for args in (("tokens", "list"), ("service-clients", "list"), ("nodes", "get", ids["node"])):
        flag = json.loads(ok(admin(*args, "--json")))
        option = json.loads(ok(admin(*args, "-o", "json")))
        if args[0] == "nodes":
            # A heartbeat may land between the two reads.
            for view in (flag, option):
                view.pop("last_heartbeat_at")
                view.pop("liveness")
        assert flag == option, args


# The table builder alone ----------------------------------------------------------------


def _rows(count: int) -> list[dict[str, Any]]:
    now = datetime.now(UTC)
    return [
        {
            "id": uuid.uuid4(),
            "host": f"host-{i}-" + "x" * (i * 17),
            "state": "succeeded" if i % 2 else "online",
            "labels": {f"k{j}": "v" * j for j in range(i)},
            "note": "東京 " * i + "[red]not markup[/red]",
            "at": now - timedelta(seconds=i * 97),
        }
        for i in range(6)
    ]


COLUMNS: list[Column[dict[str, Any]]] = [
    Column("ID", lambda r: r["id"]),
    Column("HOST", lambda r: r["host"], flex=True),
    Column("STATE", lambda r: r["state"], styled=True),
    Column("LABELS", lambda r: r["labels"], flex=2),
    Column("NOTE", lambda r: r["note"], flex=2),
    Column("AT", lambda r: r["at"]),
    Column("CREATED", lambda r: r["at"], wide=True),
]


@pytest.mark.fast
@pytest.mark.parametrize("width", [20, 40, 60, 80, 120, 200, 400])
def test_the_table_builder_keeps_each_row_on_one_line(width: int) -> None:
    buffer = StringIO()
    console = Console(file=buffer, width=width, force_terminal=True, color_system="truecolor")
    rows = _rows(6)
    Output(Format.TABLE, console=console).rows(rows, COLUMNS)
    lines = plain(buffer.getvalue())
    fits(lines, width)
    assert len(lines) == 1 + len(rows), lines
    for row, line in zip(rows, lines[1:], strict=True):
        assert line.startswith(str(row["id"])[:8]), line
    if width >= 80:
        # The rigid columns are whole: the state, the age.
        assert all(r["state"] in line for r, line in zip(rows, lines[1:], strict=True))
        assert ago(rows[-1]["at"]) in lines[-1]
        assert "CREATED" not in lines[0]


@pytest.mark.fast
def test_wide_rows_are_whole_even_past_the_terminal() -> None:
    buffer = StringIO()
    console = Console(file=buffer, width=60, force_terminal=False)
    rows = _rows(4)
    Output(Format.WIDE, console=console).rows(rows, COLUMNS)
    text = buffer.getvalue()
    for row in rows:
        assert str(row["id"]) in text and row["host"] in text and iso(row["at"]) in text
    assert len(text.splitlines()) == 1 + len(rows)


@pytest.mark.fast
@pytest.mark.parametrize(
    ("key", "shown"),
    [
        ("last_heartbeat_at", "Last Heartbeat"),
        ("drain_deadline_s", "Drain Deadline (s)"),
        ("memory_total_bytes", "Memory Total (bytes)"),
        ("display name", "Display Name"),
        ("id", "ID"),
        ("GPUs", "GPUs"),
        ("API last seen", "API Last Seen"),
        ("artifact commit", "Artifact Commit"),
    ],
)
def test_a_get_labels_its_keys_in_title_case(key: str, shown: str) -> None:
    assert label(key) == shown


@pytest.mark.fast
def test_times_read_the_one_way() -> None:
    now = datetime(2026, 12, 5, 12, 0, 0, tzinfo=UTC)
    assert ago(now - timedelta(seconds=4), now) == "4s ago"
    assert ago(now - timedelta(minutes=3, seconds=5), now) == "3m ago"
    assert ago(now + timedelta(hours=2), now) == "in 2h"
    assert iso(now) == "2026-12-05T12:00:00Z"


def _deployment(**extra: Any) -> DeploymentView:
    now = datetime.now(UTC)
    return DeploymentView.model_validate(
        {
            "id": str(uuid.uuid4()),
            "model": "smol",
            "roles": ["planner"],
            "endpoints": ["chat"],
            "node_id": str(uuid.uuid4()),
            "device_id": "gpu:0",
            "artifact": {"repository": "acme/tiny", "commit": "a" * 40, "path": "m.gguf"},
            "profile_id": str(uuid.uuid4()),
            "profile_version": 2,
            "environment_id": str(uuid.uuid4()),
            "state": "ready",
            "max_concurrent": 4,
            "failure": None,
            "queue_depth": 0,
            "cooldown_until": None,
            "cooldown_reason": None,
            "drain_deadline_s": None,
            "job_id": None,
            "created_at": now.isoformat(),
            "updated_at": now.isoformat(),
            "state_changed_at": now.isoformat(),
        }
        | extra
    )


@pytest.mark.fast
def test_deployments_get_reads_as_labelled_keys() -> None:
    """What `deployments get` prints (show_detail: the view's fields, nested ones each
    under its own key): Title Case, aligned, never `commit=…,path=…` nor snake_case."""
    view = _deployment()
    buffer = StringIO()
    Output(Format.TABLE, console=Console(file=buffer, width=100)).detail(view, fields_of(view))
    lines = buffer.getvalue().splitlines()
    keys = [line.split(":")[0] for line in lines]
    assert "Artifact Commit" in keys and "Node ID" in keys and "State Changed" in keys
    assert "Drain Deadline (s)" in keys
    assert not any("_" in key or key[:1].islower() for key in keys), keys
    assert "commit=" not in buffer.getvalue()
    # Aligned: every value starts in the same column.
    starts = {len(line) - len(line.split(":", 1)[1].lstrip()) for line in lines}
    assert len(starts) == 1, lines
    assert ISO.search(next(line for line in lines if line.startswith("Created:")))


@pytest.mark.fast
def test_the_audit_table_at_80_columns_keeps_who_and_what() -> None:
    """The correlation id gives way before the action (`deploym…` said nothing), and a
    node's actor shows its short id as the target's does; -o wide has both whole."""
    node = uuid.uuid4()
    record = AuditRecord(
        id=27, at=datetime.now(UTC), actor=f"node:{node}", action="deployment.state_changed",
        target_type="deployment", target_id=str(uuid.uuid4()),
        correlation_id=f"agent-{uuid.uuid4().hex}", details={},
    )  # fmt: skip
    buffer = StringIO()
    console = Console(file=buffer, width=80, force_terminal=True, color_system="truecolor")
    Output(Format.TABLE, console=console).rows([record], AUDIT_COLUMNS)
    lines = plain(buffer.getvalue())
    fits(lines, 80)
    assert f"node:{str(node)[:8]} " in lines[1] and "deployment.state_changed" in lines[1]
    wide = StringIO()
    Output(Format.WIDE, console=Console(file=wide, width=80)).rows([record], AUDIT_COLUMNS)
    assert f"node:{node}" in wide.getvalue() and str(record.correlation_id) in wide.getvalue()


@pytest.mark.fast
@pytest.mark.parametrize(
    ("caps", "shown"),
    [
        (None, "unknown"),
        ({"supports_tools": True, "supports_tool_calls": False}, "no"),
        ({"supports_tools": True, "supports_tool_calls": True}, "yes"),
        (
            {"supports_tools": True, "supports_tool_calls": True,
             "supports_parallel_tool_calls": True},
            "yes, in parallel",
        ),
    ],
)  # fmt: skip
def test_a_deployments_tool_calls_read_from_its_reported_caps(
    caps: dict[str, bool] | None, shown: str
) -> None:
    """`deployments get` answers Tool Calls beside the endpoints (what the gateway asks
    of a request with tools), never the caps' three keys."""
    view = _deployment(endpoints=["chat", "embeddings"], capabilities=caps)
    buffer = StringIO()
    Output(Format.TABLE, console=Console(file=buffer, width=80)).detail(view, detail_fields(view))
    lines = buffer.getvalue().splitlines()
    keys = [line.split(":")[0] for line in lines]
    assert keys[keys.index("Endpoints") + 1] == "Tool Calls", keys
    assert not any(key.startswith("Capabilities") for key in keys), keys
    assert re.search(rf"^Tool Calls:\s+{shown}\s*$", buffer.getvalue(), re.M), lines
    assert re.search(r"^Endpoints:\s+chat, embeddings\s*$", buffer.getvalue(), re.M), lines


@pytest.mark.fast
@pytest.mark.parametrize("width", [80, 120, 200])
def test_the_deployments_table_leaves_out_its_endpoints_first(width: int) -> None:
    """Long names and a failure: at 80 columns the endpoints are left out and the state
    and the node stay whole; wider, they are abbreviated; -o wide names them whole."""
    rows = [
        _deployment(
            model="m-" + "x" * 40, roles=["planner", "a-role-with-a-long-name"],
            endpoints=["chat", "completions", "embeddings"], state="failed",
            failure={"code": "load_failed", "detail": "no"},
        )
        for _ in range(3)
    ]  # fmt: skip
    buffer = StringIO()
    console = Console(file=buffer, width=width, force_terminal=True, color_system="truecolor")
    Output(Format.TABLE, console=console).rows(rows, DEPLOYMENT_COLUMNS)
    lines = plain(buffer.getvalue())
    fits(lines, width)
    assert len(lines) == 1 + len(rows)
    for view, line in zip(rows, lines[1:], strict=True):
        assert "failed" in line and str(view.node_id)[:8] in line, line
    if width == 80:
        assert "ENDPOINTS" not in lines[0] and not any("chat" in line for line in lines)
    else:
        assert "ENDPOINTS" in lines[0] and all("chat,compl,embed" in line for line in lines[1:])
    wide = StringIO()
    Output(Format.WIDE, console=Console(file=wide, width=width)).rows(rows, DEPLOYMENT_COLUMNS)
    assert wide.getvalue().count("chat,completions,embeddings") == len(rows)


def _service(name: str, endpoints: list[str], receipt: str) -> ServiceView:
    now = datetime.now(UTC).isoformat()
    artifact = {"repository": "acme/tiny", "revision": "main", "commit": "a" * 40,
                "path": "m.gguf", "size_bytes": 1000}  # fmt: skip
    return ServiceView.model_validate(
        {
            "id": str(uuid.uuid4()), "name": name, "roles": [], "state": "active",
            "template": {"artifact": artifact, "profile_id": str(uuid.uuid4()),
                         "profile_version": 1, "environment_id": None, "max_concurrent": 4,
                         "endpoints": endpoints},
            "generation": 3, "replicas": 12, "ready_replicas": 10, "autoscale": None,
            "placement": {}, "strategy": {},
            "rollout": {"state": "progressing", "generation": 3, "updated_ready": 7,
                        "desired": 12, "outdated": 5},
            "last_receipt": {"decided_at": now, "outcome": "unplaceable", "nodes_considered": 40,
                             "feasible": 0, "message": receipt},
            "created_at": now, "updated_at": now,
        }
    )  # fmt: skip


@pytest.mark.fast
@pytest.mark.parametrize("width", [80, 200])
def test_the_services_table_leaves_out_its_endpoints_first(width: int) -> None:
    """A long name and receipt: at 80 columns the endpoints are left out, the state, the
    readiness and the rollout stay whole; at 200 they are abbreviated beside them."""
    rows = [
        _service("a-served-model-with-a-long-name-" + str(i), endpoints, "0 of 40 nodes: " + NOTE)
        for i, endpoints in enumerate((["chat", "completions", "embeddings"], ["embeddings"]))
    ]
    buffer = StringIO()
    console = Console(file=buffer, width=width, force_terminal=True, color_system="truecolor")
    Output(Format.TABLE, console=console).rows(rows, SERVICE_COLUMNS)
    lines = plain(buffer.getvalue())
    fits(lines, width)
    assert len(lines) == 1 + len(rows)
    assert all("active" in line and "10/12" in line and "progressing 7/12" in line
               for line in lines[1:]), lines  # fmt: skip
    if width == 80:
        assert "ENDPOINTS" not in lines[0] and not any("embed" in line for line in lines)
    else:
        assert "ENDPOINTS" in lines[0], lines
        assert "chat,compl,embed" in lines[1] and " embed " in lines[2], lines
