"""`modelforge admin nodes …`: the fleet's nodes, their GPUs and telemetry, and what an
operator does to one (disable, enable, labels, credentials, decommission)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from cli.admin.answers import answer, show_page, show_row
from cli.admin.client import AdminClient, AdminFailure
from cli.admin.context import JsonOption, LimitOption, WatchOption, admin, output
from cli.admin.output import Column, Output, cell, size, styled
from cli.admin.watch import follow
from schemas.admin import (
    CredentialRevoked,
    CredentialRotated,
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
from schemas.artifacts import NodeArtifact, NodeArtifactList
from schemas.events import CloudEvent
from schemas.protocol import NODES
from schemas.runtime_local import NodeRuntimeView, RuntimeDevice

app = typer.Typer(help="nodes: liveness, GPUs, telemetry, labels; disable, rotate, decommission")
credential_app = typer.Typer(help="a node's credential: revoke, rotate")
app.add_typer(credential_app, name="credential")

NodeArg = Annotated[uuid.UUID, typer.Argument(help="the node's id")]

NODE_COLUMNS: list[Column[NodeSummary]] = [
    Column("ID", lambda n: n.id),
    Column("HOSTNAME", lambda n: n.hostname),
    Column("NAME", lambda n: n.display_name),
    Column("LIVENESS", lambda n: n.liveness, styled=True),
    Column("ENABLED", lambda n: n.enabled),
    Column("AGENT", lambda n: n.agent_version),
    Column("LABELS", lambda n: n.labels),
    Column("LAST HEARTBEAT", lambda n: n.last_heartbeat_at),
]

GPU_COLUMNS: list[Column[GpuInfo]] = [
    Column("INDEX", lambda g: g.index),
    Column("UUID", lambda g: g.uuid),
    Column("NAME", lambda g: g.name),
    Column("MEMORY", lambda g: size(g.memory_total_bytes)),
    Column("STATE", lambda g: "missing" if g.missing else "present", styled=True),
    Column("MISSING SINCE", lambda g: g.missing_since),
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
    watch: WatchOption = False,
) -> None:
    """The nodes, like `nomad node status`."""
    out = output(json)
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
    node: Annotated[uuid.UUID | None, typer.Argument(help="only this node")] = None,
    count: Annotated[int | None, typer.Option(min=1, help="exit after this many events")] = None,
    json: JsonOption = False,
) -> None:
    """The nodes, then a row for each node event as it happens (the event's JSON with
    --json)."""
    out = output(json)
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
    out.line(f"{event.time:%H:%M:%S}  {event.action:<26} {event.nodeid}  ", *now)
    return True


@app.command("get")
def get_node(ctx: typer.Context, node: NodeArg, json: JsonOption = False) -> None:
    """One node: liveness, inventory, GPUs (missing ones flagged), telemetry, labels."""
    out = output(json)
    detail = answer(ctx, lambda c: c.get(NodeDetail, f"{NODES}/{node}"))
    if out.json_mode:
        out.json(detail)
        return
    host = detail.inventory.host if detail.inventory else None
    out.detail(
        detail,
        [
            ("id", detail.id),
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
        ],
    )
    missing = [g for g in detail.gpus if g.missing]
    title = f"GPUs ({len(missing)} missing)" if missing else "GPUs"
    out.rows(detail.gpus, GPU_COLUMNS, title=title)
    telemetry = detail.telemetry
    if telemetry is not None:
        out.line(f"RAM {size(telemetry.ram_used_bytes)} of {size(telemetry.ram_total_bytes)} used")
        rows = [
            (g.uuid, g.utilization_percent, size(g.memory_used_bytes), g.temperature_c, g.power_w)
            for g in telemetry.gpus
        ]
        if rows:
            out.line("UUID  UTIL%  MEM USED  TEMP C  POWER W")
            for row in rows:
                out.line("  ".join(cell(v) for v in row))


def _patch(ctx: typer.Context, node: uuid.UUID, body: NodePatch, json: bool) -> None:
    show_row(
        ctx, json, NODE_COLUMNS, lambda c: c.call(NodeDetail, "PATCH", f"{NODES}/{node}", body=body)
    )


@app.command("disable")
def disable(ctx: typer.Context, node: NodeArg, json: JsonOption = False) -> None:
    """Refuse the node's traffic and schedule nothing on it (reversible)."""
    _patch(ctx, node, NodePatch(enabled=False), json)


@app.command("enable")
def enable(ctx: typer.Context, node: NodeArg, json: JsonOption = False) -> None:
    _patch(ctx, node, NodePatch(enabled=True), json)


@app.command("label")
def label(
    ctx: typer.Context,
    node: NodeArg,
    labels: Annotated[list[str], typer.Argument(help="key=value to set, key- to remove")],
    json: JsonOption = False,
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
    _patch(ctx, node, NodePatch.model_validate({"labels": current}), json)


@credential_app.command("revoke")
def revoke_credential(ctx: typer.Context, node: NodeArg, json: JsonOption = False) -> None:
    """Revoke the node's credentials: it is refused until it is given a new one."""
    out = output(json)
    revoked = answer(ctx, lambda c: c.post(CredentialRevoked, f"{NODES}/{node}/credential/revoke"))
    if out.json_mode:
        out.json(revoked)
    else:
        out.line(f"revoked {len(revoked.revoked_credential_ids)} credential(s)")


@credential_app.command("rotate")
def rotate_credential(
    ctx: typer.Context,
    node: NodeArg,
    state_dir: Annotated[
        Path | None,
        typer.Option(help="the agent's state dir: install the new credential there at once"),
    ] = None,
    json: JsonOption = False,
) -> None:
    """Issue a new credential (the old ones are revoked). With --state-dir (run on the
    node), it is installed in the agent's state in the same step; otherwise it is shown
    once, for `modelforge agent install-credential`."""
    from agent.errors import AgentError
    from agent.state import StateDir

    out = output(json)
    state = StateDir(state_dir) if state_dir is not None else None
    if state is not None:
        # Checked before rotating: a credential rotated for the wrong state dir would
        # revoke the node's working one and have nowhere to go.
        try:
            identity = state.load_identity()
        except (AgentError, OSError) as exc:
            raise AdminFailure(f"{state_dir}: {exc}") from None
        if identity is None or identity.node_id != node:
            held = "no identity" if identity is None else f"node {identity.node_id}"
            raise AdminFailure(f"{state_dir} holds {held}, not node {node}; nothing was rotated")
    rotated = answer(ctx, lambda c: c.post(CredentialRotated, f"{NODES}/{node}/credential/rotate"))
    if state is None:
        if out.json_mode:
            out.json(rotated)
        else:
            out.line(
                f"credential {rotated.credential_id} (shown once; install it on the node "
                "with `modelforge agent install-credential`):"
            )
            out.secret(rotated.credential)
        return
    try:
        installed = state.install_credential(rotated.model_dump_json())
    except (AgentError, OSError) as exc:
        # The new credential exists only here now: never lose it.
        out.error(f"installing failed ({exc}); the credential, shown once:")
        out.secret(rotated.model_dump_json())
        raise AdminFailure("the credential was rotated but not installed") from None
    out.note(
        f"installed credential {installed.credential_id} for node {installed.node_id} in "
        f"{state_dir}; a running agent picks it up when its old one is refused"
    )
    if out.json_mode:
        # The secret stays in the state dir: only its id is printed.
        out.json(
            CredentialRevoked(node_id=node, revoked_credential_ids=rotated.revoked_credential_ids)
        )


@app.command("decommission")
def decommission(
    ctx: typer.Context,
    node: NodeArg,
    reason: Annotated[str, typer.Option(help="why (audited)")] = "decommissioned by operator",
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask")] = False,
    preview_only: Annotated[bool, typer.Option("--preview", help="show the plan only")] = False,
    json: JsonOption = False,
) -> None:
    """Show the plan (credentials and tokens revoked, jobs cancelled, deployments
    unloaded), ask, then execute exactly that plan: its hash is sent back, so a plan that
    changed meanwhile is refused (409 decommission_plan_changed) and nothing is done."""
    out = output(json)
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
    Column("REPOSITORY", lambda a: a.repository),
    Column("COMMIT", lambda a: a.commit[:12]),
    Column("ROOT", lambda a: a.root),
    Column("FILES", lambda a: len(a.files)),
    Column("SIZE", lambda a: size(sum(f.size for f in a.files))),
    Column("JOB", lambda a: a.job_id),
    Column("RECORDED", lambda a: a.recorded_at),
]
DEVICE_COLUMNS: list[Column[RuntimeDevice]] = [
    Column("DEVICE", lambda d: d.device_id),
    Column("BACKEND", lambda d: d.backend),
    Column("NAME", lambda d: d.name),
    Column("FREE", lambda d: size(d.memory_free_bytes)),
    Column("LOADED", lambda d: d.loaded_model),
    Column("QUEUE", lambda d: d.queue_depth),
]


@app.command("artifacts")
def artifacts(ctx: typer.Context, node: NodeArg, json: JsonOption = False) -> None:
    """The node's artifact inventory: what completed jobs verified, and where."""
    show_page(
        ctx, json, ARTIFACT_COLUMNS, lambda c: c.get(NodeArtifactList, f"{NODES}/{node}/artifacts")
    )


@app.command("runtime")
def node_runtime(ctx: typer.Context, node: NodeArg, json: JsonOption = False) -> None:
    """What the node's runtime worker last reported: devices, loaded and served models."""
    out = output(json)
    view = answer(ctx, lambda c: c.get(NodeRuntimeView, f"{NODES}/{node}/runtime"))
    out.table(view, view.devices, DEVICE_COLUMNS)
    if not out.json_mode:
        if not view.reported:
            out.note("no report from its runtime worker yet")
        served = ", ".join(m.model_id for m in view.served_models) or "-"
        out.note(f"served: {served}")
