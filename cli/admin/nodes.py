"""`modelforge admin nodes …`: the fleet's nodes, their GPUs and telemetry, and what an
operator does to one (disable, enable, labels, credentials, decommission)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Annotated

import typer
from rich.text import Text

from cli.admin import credentials
from cli.admin.answers import answer, show_page, show_row
from cli.admin.client import AdminClient, AdminFailure
from cli.admin.context import (
    FormatOption,
    JsonOption,
    LimitOption,
    NodeArg,
    WatchOption,
    admin,
    form,
    id_argument,
    output,
)
from cli.admin.help import group
from cli.admin.output import Column, Format, Output, size, styled
from cli.admin.watch import follow
from schemas.admin import (
    DecommissionPreview,
    DecommissionRequest,
    DecommissionResult,
    GpuInfo,
    Liveness,
    NodeDetail,
    NodeList,
    NodePatch,
    NodeSummary,
)
from schemas.agent import GpuTelemetry, StorageTelemetry
from schemas.artifacts import NodeArtifact, NodeArtifactList
from schemas.events import CloudEvent
from schemas.protocol import NODES
from schemas.runtime_local import NodeRuntimeView, RuntimeDevice

app = group("Nodes: liveness, GPUs, telemetry and labels; disable, rotate, decommission.")
app.add_typer(credentials.app, name="credential")


NODE_COLUMNS: list[Column[NodeSummary]] = [
    Column("ID", lambda n: n.id),
    Column("HOSTNAME", lambda n: n.hostname, flex=True),
    Column("NAME", lambda n: n.display_name, flex=2),
    Column("LIVENESS", lambda n: n.liveness, styled=True),
    Column("ENABLED", lambda n: n.enabled),
    Column("AGENT", lambda n: n.agent_version, flex=2),
    Column("LABELS", lambda n: n.labels, flex=2),
    Column("HEARTBEAT", lambda n: n.last_heartbeat_at),
    Column("PROTOCOL", lambda n: n.protocol_version, wide=True),
    Column("ENROLLED", lambda n: n.enrolled_at, wide=True),
    Column("DECOMMISSIONED", lambda n: n.decommissioned_at, wide=True),
]


@dataclass(frozen=True)
class GpuRow:
    """A GPU of the inventory beside what its last telemetry said of it."""

    info: GpuInfo
    now: GpuTelemetry | None


GPU_COLUMNS: list[Column[GpuRow]] = [
    Column("INDEX", lambda g: g.info.index),
    Column("NAME", lambda g: g.info.name, flex=True),
    Column("MEMORY", lambda g: size(g.info.memory_total_bytes)),
    Column("USED", lambda g: size(g.now.memory_used_bytes) if g.now else None),
    Column("UTIL %", lambda g: g.now.utilization_percent if g.now else None),
    Column("TEMP °C", lambda g: g.now.temperature_c if g.now else None),
    Column("POWER W", lambda g: g.now.power_w if g.now else None),
    Column("STATE", lambda g: "missing" if g.info.missing else "present", styled=True),
    Column("UUID", lambda g: g.info.uuid, wide=True),
    Column("MISSING SINCE", lambda g: g.info.missing_since, wide=True),
    Column("DRIVER", lambda g: g.info.driver_version, wide=True),
    Column("CUDA", lambda g: g.info.cuda_version, wide=True),
]
STORAGE_COLUMNS: list[Column[StorageTelemetry]] = [
    Column("PATH", lambda s: s.path, flex=True),
    Column("USED", lambda s: size(s.used_bytes)),
    Column("TOTAL", lambda s: size(s.total_bytes)),
]


def _list(out: Output, nodes: NodeList) -> None:
    out.table(nodes, nodes.items, NODE_COLUMNS)


@app.command("list")
def list_nodes(
    ctx: typer.Context,
    liveness: Annotated[list[Liveness] | None, typer.Option(help="repeatable")] = None,
    label: Annotated[list[str] | None, typer.Option(help="key=value or key; repeatable")] = None,
    limit: LimitOption = 100,
    json: JsonOption = False,
    fmt: FormatOption = None,
    watch: WatchOption = False,
) -> None:
    """The nodes, like `nomad node status`."""
    out = output(json, fmt)
    params = {"liveness": [v.value for v in liveness or []], "label": label or [], "limit": limit}
    with admin(ctx).client() as client:

        def draw() -> None:
            _list(out, client.get(NodeList, NODES, **params))

        if not watch:
            draw()
            return
        follow(client, out, redraw=draw, on_event=lambda e: _node_row(client, out, e), type="node.")


@app.command("watch")
def watch_nodes(
    ctx: typer.Context,
    node: Annotated[uuid.UUID | None, id_argument("only this node")] = None,
    count: Annotated[int | None, typer.Option(min=1, help="exit after this many events")] = None,
    json: JsonOption = False,
    fmt: FormatOption = None,
) -> None:
    """The nodes, then a line for each node event as it happens.

    With -o json, each event's JSON."""
    out = output(json, fmt)
    with admin(ctx).client() as client:

        def draw() -> None:
            if node is None:
                _list(out, client.get(NodeList, NODES))
            elif not out.json_mode:
                detail = client.get(NodeDetail, f"{NODES}/{node}")
                out.rows([detail], NODE_COLUMNS)

        follow(
            client,
            out,
            redraw=draw,
            on_event=lambda e: _node_row(client, out, e),
            limit=count,
            type="node.",
            node_id=node,
        )


def _node_row(client: AdminClient, out: Output, event: CloudEvent) -> bool:
    if event.nodeid is None:
        return False
    if out.json_mode:
        out.json(event)
        return True
    now: list[str | Text]
    try:
        node = client.get(NodeDetail, f"{NODES}/{event.nodeid}")
        now = [styled(node.liveness.value), " ", node.hostname]
    except AdminFailure:
        now = ["-"]
    out.row_line(f"{event.time:%H:%M:%S}  {event.action:<26} {out.id(event.nodeid)}  ", *now)
    return True


@app.command("get")
def get_node(
    ctx: typer.Context, node: NodeArg, json: JsonOption = False, fmt: FormatOption = None
) -> None:
    """One node: liveness, inventory, GPUs (missing ones flagged), telemetry, labels."""
    out = output(json, fmt)
    detail = answer(ctx, lambda c: c.get(NodeDetail, f"{NODES}/{node}"))
    if out.json_mode:
        out.json(detail)
        return
    host = detail.inventory.host if detail.inventory else None
    telemetry = detail.telemetry
    out.detail(
        detail,
        [
            ("ID", detail.id),
            ("hostname", detail.hostname),
            ("display name", detail.display_name),
            ("liveness", detail.liveness),
            ("enabled", detail.enabled),
            ("labels", detail.labels),
            ("agent", f"{detail.agent_version} (protocol {detail.protocol_version})"),
            ("capabilities", detail.capabilities),
            ("credential", "active" if detail.has_active_credential else "none"),
            ("enrolled", detail.enrolled_at),
            ("last heartbeat", detail.last_heartbeat_at),
            ("decommissioned", detail.decommissioned_at),
            ("host", f"{host.os} {host.kernel}, {host.cpu_count} CPUs" if host else None),
            ("artifact roots", host.artifact_roots if host else None),
            (
                "RAM",
                f"{size(telemetry.ram_used_bytes)} used of {size(telemetry.ram_total_bytes)}"
                if telemetry
                else None,
            ),
        ],
    )
    now = {g.uuid.lower(): g for g in telemetry.gpus} if telemetry else {}
    rows = [GpuRow(g, now.get(g.uuid.lower())) for g in detail.gpus]
    missing = [g for g in detail.gpus if g.missing]
    title = f"GPUs ({len(missing)} missing)" if missing else "GPUs"
    out.rows(rows, GPU_COLUMNS, title=title)
    if telemetry is not None and telemetry.storage:
        out.rows(telemetry.storage, STORAGE_COLUMNS, title="Storage")


def _patch(ctx: typer.Context, node: uuid.UUID, body: NodePatch, how: Format) -> None:
    show_row(
        ctx, how, NODE_COLUMNS, lambda c: c.call(NodeDetail, "PATCH", f"{NODES}/{node}", body=body)
    )


@app.command("disable")
def disable(
    ctx: typer.Context, node: NodeArg, json: JsonOption = False, fmt: FormatOption = None
) -> None:
    """Refuse the node's traffic and schedule nothing on it (reversible)."""
    _patch(ctx, node, NodePatch(enabled=False), form(json, fmt))


@app.command("enable")
def enable(
    ctx: typer.Context, node: NodeArg, json: JsonOption = False, fmt: FormatOption = None
) -> None:
    """Take the node's traffic and schedule on it again (undoes disable)."""
    _patch(ctx, node, NodePatch(enabled=True), form(json, fmt))


@app.command("label")
def label(
    ctx: typer.Context,
    node: NodeArg,
    labels: Annotated[list[str], typer.Argument(help="key=value to set, key- to remove")],
    json: JsonOption = False,
    fmt: FormatOption = None,
) -> None:
    """Set or remove labels (`kubectl label` style); the others are kept."""
    current = dict(answer(ctx, lambda c: c.get(NodeDetail, f"{NODES}/{node}")).labels)
    for item in labels:
        if item.endswith("-") and "=" not in item:
            current.pop(item[:-1], None)
        elif "=" in item:
            key, _, value = item.partition("=")
            current[key] = value
        else:
            raise typer.BadParameter(f"{item!r}: give key=value or key-")
    _patch(ctx, node, NodePatch.model_validate({"labels": current}), form(json, fmt))


@app.command("decommission")
def decommission(
    ctx: typer.Context,
    node: NodeArg,
    reason: Annotated[str, typer.Option(help="why (audited)")] = "decommissioned by operator",
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask")] = False,
    preview_only: Annotated[bool, typer.Option("--preview", help="show the plan only")] = False,
    json: JsonOption = False,
    fmt: FormatOption = None,
) -> None:
    """Retire a node for good: show the plan, ask, then execute exactly that plan.

    The plan: credentials and tokens revoked, jobs cancelled, deployments unloaded. Its
    hash is sent back, so a plan that changed meanwhile is refused (409
    decommission_plan_changed) and nothing is done."""
    out = output(json, fmt)
    with admin(ctx).client() as client:
        plan = client.get(DecommissionPreview, f"{NODES}/{node}/decommission/preview")
        if preview_only or not out.json_mode:
            _show_plan(out, plan)
        if preview_only:
            return
        if not yes and not typer.confirm(f"decommission node {node}? this cannot be undone"):
            raise typer.Exit(1)
        request = DecommissionRequest(confirm_node_id=node, plan_hash=plan.plan_hash, reason=reason)
        result = client.post(DecommissionResult, f"{NODES}/{node}/decommission", request)
    if out.json_mode:
        out.json(result)
    else:
        out.line(
            f"decommissioned {result.node_id}: revoked {len(result.revoked_credential_ids)} "
            f"credential(s), {len(result.revoked_enrollment_token_ids)} token(s); cancelled "
            f"{len(result.cancelled_job_ids)} job(s), unloaded "
            f"{len(result.unloaded_deployment_ids)} deployment(s)"
        )


def _show_plan(out: Output, plan: DecommissionPreview) -> None:
    out.detail(
        plan,
        [
            ("node", plan.node_id),
            ("liveness", plan.liveness),
            ("already decommissioned", plan.already_decommissioned),
            ("credentials to revoke", len(plan.credentials_to_revoke)),
            ("enrollment tokens to revoke", len(plan.enrollment_tokens_to_revoke)),
            (
                "jobs to cancel",
                [f"{j.kind.value} {j.id} ({j.state.value})" for j in plan.jobs_to_cancel],
            ),
            (
                "deployments to unload",
                [f"{d.model} on {d.device_id}" for d in plan.deployments_to_unload],
            ),
            ("GPUs", plan.gpus),
            ("plan hash", plan.plan_hash),
        ],
    )


ARTIFACT_COLUMNS: list[Column[NodeArtifact]] = [
    Column("REPOSITORY", lambda a: a.repository, flex=True),
    Column("COMMIT", lambda a: a.commit[:12], full=lambda a: a.commit),
    Column("ROOT", lambda a: a.root, flex=True),
    Column("FILES", lambda a: len(a.files)),
    Column("SIZE", lambda a: size(sum(f.size for f in a.files))),
    Column("JOB", lambda a: a.job_id),
    Column("RECORDED", lambda a: a.recorded_at),
]
DEVICE_COLUMNS: list[Column[RuntimeDevice]] = [
    Column("DEVICE", lambda d: d.device_id),
    Column("BACKEND", lambda d: d.backend),
    Column("NAME", lambda d: d.name, flex=True),
    Column("FREE", lambda d: size(d.memory_free_bytes)),
    Column("LOADED", lambda d: d.loaded_model, flex=True),
    Column("QUEUE", lambda d: d.queue_depth),
]


@app.command("artifacts")
def artifacts(
    ctx: typer.Context, node: NodeArg, json: JsonOption = False, fmt: FormatOption = None
) -> None:
    """The node's artifact inventory: what completed jobs verified, and where."""
    show_page(
        ctx,
        form(json, fmt),
        ARTIFACT_COLUMNS,
        lambda c: c.get(NodeArtifactList, f"{NODES}/{node}/artifacts"),
    )


@app.command("runtime")
def node_runtime(
    ctx: typer.Context, node: NodeArg, json: JsonOption = False, fmt: FormatOption = None
) -> None:
    """What the node's runtime worker last reported: devices, loaded and served models."""
    out = output(json, fmt)
    view = answer(ctx, lambda c: c.get(NodeRuntimeView, f"{NODES}/{node}/runtime"))
    out.table(view, view.devices, DEVICE_COLUMNS)
    if not out.json_mode:
        if not view.reported:
            out.note("no report from its runtime worker yet")
        served = ", ".join(m.model_id for m in view.served_models) or "-"
        out.note(f"served: {served}")
