"""`modelforge admin deployments …`: what the gateway serves, each a model loaded on one
node's device."""

from __future__ import annotations

import uuid
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated

import typer
from rich.status import Status

from cli.admin.answers import show_detail, show_page, show_row
from cli.admin.bodies import DEPLOYMENT_BODY, read_body
from cli.admin.cells import endpoints
from cli.admin.context import FormatOption, JsonOption, admin, form, id_argument, id_option, output
from cli.admin.help import group
from cli.admin.output import Column, Format, Output, fields_of, join, styled
from cli.admin.runtime import JOB_COLUMNS
from cli.admin.watch import follow_one
from schemas.deployments import (
    ENDED_STATES,
    DeploymentCreate,
    DeploymentDrain,
    DeploymentJobList,
    DeploymentList,
    DeploymentState,
    DeploymentView,
)
from schemas.endpoints import ChatTemplateCaps
from schemas.protocol import DEPLOYMENTS

app = group("Deployments: a model loaded on one node's device, served by the gateway.")

DeploymentArg = Annotated[uuid.UUID, id_argument("the deployment's id")]

DEPLOYMENT_COLUMNS: list[Column[DeploymentView]] = [
    Column("ID", lambda d: d.id),
    Column("MODEL", lambda d: d.model, flex=True),
    Column("ROLES", lambda d: d.roles, flex=True),
    # What it serves: left out first where the row does not fit (a `get` has it).
    Column(
        "ENDPOINTS",
        lambda d: endpoints(d.endpoints),
        optional=True,
        full=lambda d: endpoints(d.endpoints, wide=True),
    ),
    Column("NODE", lambda d: d.node_id),
    Column("DEVICE", lambda d: d.device_id),
    Column("STATE", lambda d: d.state, styled=True),
    Column("SINCE", lambda d: d.state_changed_at),
    Column("FAILURE", lambda d: d.failure.code if d.failure else None, flex=True),
    Column("MAX", lambda d: d.max_concurrent, wide=True),
    Column("QUEUE", lambda d: d.queue_depth, wide=True),
    Column("TOOL CALLS", lambda d: tool_calls(d.capabilities), wide=True),
    Column("COOLDOWN UNTIL", lambda d: d.cooldown_until, wide=True),
    Column("ARTIFACT", lambda d: f"{d.artifact.repository}@{d.artifact.commit}", wide=True),
    Column("PROFILE", lambda d: d.profile_id, wide=True),
    Column("ENVIRONMENT", lambda d: d.environment_id, wide=True),
    Column("CREATED", lambda d: d.created_at, wide=True),
]


@app.command("list")
def list_deployments(
    ctx: typer.Context,
    node: Annotated[uuid.UUID | None, id_option("only this node's")] = None,
    state: Annotated[list[DeploymentState] | None, typer.Option(help="repeatable")] = None,
    json: JsonOption = False,
    fmt: FormatOption = None,
) -> None:
    """The deployments: model, node, device, state."""
    show_page(
        ctx,
        form(json, fmt),
        DEPLOYMENT_COLUMNS,
        lambda c: c.get(DeploymentList, DEPLOYMENTS, node_id=node, state=state),
    )


@app.command("get")
def get_deployment(
    ctx: typer.Context,
    deployment: DeploymentArg,
    json: JsonOption = False,
    fmt: FormatOption = None,
) -> None:
    """One deployment: its model, endpoints, node, device, state, artifact and failure."""
    show_detail(
        ctx,
        form(json, fmt),
        lambda c: c.get(DeploymentView, f"{DEPLOYMENTS}/{deployment}"),
        detail_fields,
    )


@app.command("create", epilog=DEPLOYMENT_BODY)
def create_deployment(
    ctx: typer.Context,
    file: Annotated[
        Path, typer.Option("--file", "-f", help="the request body (JSON; - for stdin)")
    ],
    json: JsonOption = False,
    fmt: FormatOption = None,
) -> None:
    """Create a deployment from a JSON body: a model loaded on one node's device."""
    body = read_body(file, DeploymentCreate)
    show_row(
        ctx,
        form(json, fmt),
        DEPLOYMENT_COLUMNS,
        lambda c: c.call(DeploymentView, "POST", DEPLOYMENTS, body=body),
    )


@app.command("jobs")
def deployment_jobs(
    ctx: typer.Context,
    deployment: DeploymentArg,
    json: JsonOption = False,
    fmt: FormatOption = None,
) -> None:
    """The deployment's lifecycle jobs (load, health, drain, unload)."""
    show_page(
        ctx,
        form(json, fmt),
        JOB_COLUMNS,
        lambda c: c.get(DeploymentJobList, f"{DEPLOYMENTS}/{deployment}/jobs"),
    )


@app.command("drain")
def drain(
    ctx: typer.Context,
    deployment: DeploymentArg,
    deadline: Annotated[float, typer.Option(help="seconds in-flight invokes get")] = 60.0,
    json: JsonOption = False,
    fmt: FormatOption = None,
) -> None:
    """No new invokes; those in flight get --deadline; then the model is unloaded."""
    _act(ctx, form(json, fmt), deployment, "drain", DeploymentDrain(deadline_s=deadline))


@app.command("unload")
def unload(
    ctx: typer.Context,
    deployment: DeploymentArg,
    json: JsonOption = False,
    fmt: FormatOption = None,
) -> None:
    """A drain with no deadline: in-flight invokes are cut at once."""
    _act(ctx, form(json, fmt), deployment, "unload")


def tool_calls(caps: ChatTemplateCaps | None) -> str:
    """Whether the loaded model's chat template calls tools (what the gateway asks of a
    deployment for a request with `tools`); unknown before a load, or from a node that
    does not say."""
    if caps is None:
        return "unknown"
    if not caps.supports_tool_calls:
        return "no"
    return "yes, in parallel" if caps.supports_parallel_tool_calls else "yes"


def detail_fields(view: DeploymentView) -> list[tuple[str, object]]:
    """A `get`'s keys: the view's fields, with the template's caps as the one answer an
    operator asks of them (Tool Calls) beside the endpoints."""
    fields: list[tuple[str, object]] = []
    for key, value in fields_of(view):
        if key.startswith("capabilities"):
            continue
        fields.append((key, value))
        if key == "endpoints":
            fields.append(("tool calls", tool_calls(view.capabilities)))
    return fields


def _act(
    ctx: typer.Context,
    how: Format,
    deployment: uuid.UUID,
    action: str,
    body: DeploymentDrain | None = None,
) -> None:
    show_row(
        ctx,
        how,
        DEPLOYMENT_COLUMNS,
        lambda c: c.post(DeploymentView, f"{DEPLOYMENTS}/{deployment}/{action}", body),
    )


@app.command("watch")
def watch(
    ctx: typer.Context,
    deployment: DeploymentArg,
    until: Annotated[DeploymentState, typer.Option(help="exit 0 once it is in this state")] = (
        DeploymentState.READY
    ),
    json: JsonOption = False,
    fmt: FormatOption = None,
) -> None:
    """Follow a deployment (a model load, a drain): a line per state it passes through.

    Read from the event stream (each state's JSON with -o json). Exits 0 in --until's
    state, 1 when it ends in another (failed, unloaded)."""
    out = output(json, fmt)
    shown: list[DeploymentState] = []
    with admin(ctx).client() as client, _status(out, deployment) as status:

        def read() -> DeploymentView:
            view = client.get(DeploymentView, f"{DEPLOYMENTS}/{deployment}")
            if not shown or shown[-1] is not view.state:
                shown.append(view.state)
                if out.json_mode:
                    out.json(view)
                else:
                    failure = (
                        f" ({view.failure.code}: {view.failure.detail})" if view.failure else ""
                    )
                    out.line(
                        f"{view.model} on {out.id(view.node_id)}/{view.device_id}: ",
                        styled(view.state.value),
                        failure,
                    )
                if status is not None:
                    status.update(
                        join(f"{view.model}: {view.state.value}, waiting for {until.value}")
                    )
            return view

        final = follow_one(
            client,
            out,
            target=deployment,
            # Where it was asked to get, or an end short of it.
            read=read,
            done=lambda view: view.state is until or view.state in ENDED_STATES,
            type="deployment.",
        )
    if final.state is not until:
        raise typer.Exit(1)


def _status(out: Output, deployment: uuid.UUID) -> Status | nullcontext[None]:
    """A spinner while a model loads, on a terminal only (a pipe gets the lines)."""
    if out.json_mode or not out.console.is_terminal:
        return nullcontext()
    return out.console.status(join(f"deployment {deployment}"))
