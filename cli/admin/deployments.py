"""`modelforge admin deployments …` and `modelforge admin service-clients …`: what the
gateway serves, and who may call it."""

from __future__ import annotations

import uuid
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.status import Status

from cli.admin.answers import show_detail, show_page, show_row
from cli.admin.bodies import read_body
from cli.admin.context import JsonOption, admin, output
from cli.admin.output import Column, Output, join, styled
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
from schemas.protocol import DEPLOYMENTS, SERVICE_CLIENTS
from schemas.service_clients import (
    ServiceClientCreate,
    ServiceClientCreated,
    ServiceClientList,
    ServiceClientView,
)

app = typer.Typer(help="deployments: create, list, get, watch, jobs, drain, unload")
clients = typer.Typer(help="service clients of the gateway: create, list, get, rotate, revoke")

DeploymentArg = Annotated[uuid.UUID, typer.Argument(help="the deployment's id")]
ClientArg = Annotated[uuid.UUID, typer.Argument(help="the service client's id")]

DEPLOYMENT_COLUMNS: list[Column[DeploymentView]] = [
    Column("ID", lambda d: d.id),
    Column("MODEL", lambda d: d.model),
    Column("ROLES", lambda d: d.roles),
    Column("NODE", lambda d: d.node_id),
    Column("DEVICE", lambda d: d.device_id),
    Column("STATE", lambda d: d.state, styled=True),
    Column("MAX", lambda d: d.max_concurrent),
    Column("FAILURE", lambda d: d.failure.code if d.failure else None),
]
CLIENT_COLUMNS: list[Column[ServiceClientView]] = [
    Column("ID", lambda c: c.id),
    Column("NAME", lambda c: c.name),
    Column("STATE", lambda c: c.state, styled=True),
    Column("MODELS", lambda c: c.models),
    Column("ROLES", lambda c: c.roles),
    Column("MAX", lambda c: c.max_concurrent),
    Column("RATE/MIN", lambda c: c.rate_per_minute),
    Column("CREATED", lambda c: c.created_at),
]


@app.command("list")
def list_deployments(
    ctx: typer.Context,
    node: Annotated[uuid.UUID | None, typer.Option()] = None,
    state: Annotated[list[DeploymentState] | None, typer.Option(help="repeatable")] = None,
    json: JsonOption = False,
) -> None:
    show_page(
        ctx,
        json,
        DEPLOYMENT_COLUMNS,
        lambda c: c.get(DeploymentList, DEPLOYMENTS, node_id=node, state=state),
    )


@app.command("get")
def get_deployment(ctx: typer.Context, deployment: DeploymentArg, json: JsonOption = False) -> None:
    show_detail(ctx, json, lambda c: c.get(DeploymentView, f"{DEPLOYMENTS}/{deployment}"))


@app.command("create")
def create_deployment(
    ctx: typer.Context,
    file: Annotated[
        Path, typer.Option("--file", "-f", help="the request body (JSON; - for stdin)")
    ],
    json: JsonOption = False,
) -> None:
    body = read_body(file, DeploymentCreate)
    show_row(
        ctx,
        json,
        DEPLOYMENT_COLUMNS,
        lambda c: c.call(DeploymentView, "POST", DEPLOYMENTS, body=body),
    )


@app.command("jobs")
def deployment_jobs(
    ctx: typer.Context, deployment: DeploymentArg, json: JsonOption = False
) -> None:
    """The deployment's lifecycle jobs (load, health, drain, unload)."""
    show_page(
        ctx,
        json,
        JOB_COLUMNS,
        lambda c: c.get(DeploymentJobList, f"{DEPLOYMENTS}/{deployment}/jobs"),
    )


@app.command("drain")
def drain(
    ctx: typer.Context,
    deployment: DeploymentArg,
    deadline: Annotated[float, typer.Option(help="seconds in-flight invokes get")] = 60.0,
    json: JsonOption = False,
) -> None:
    """No new invokes; those in flight get --deadline; then the model is unloaded."""
    _act(ctx, json, deployment, "drain", DeploymentDrain(deadline_s=deadline))


@app.command("unload")
def unload(ctx: typer.Context, deployment: DeploymentArg, json: JsonOption = False) -> None:
    """A drain with no deadline: in-flight invokes are cut at once."""
    _act(ctx, json, deployment, "unload")


def _act(
    ctx: typer.Context,
    json: bool,
    deployment: uuid.UUID,
    action: str,
    body: DeploymentDrain | None = None,
) -> None:
    show_row(
        ctx,
        json,
        DEPLOYMENT_COLUMNS,
        lambda c: c.post(DeploymentView, f"{DEPLOYMENTS}/{deployment}/{action}", body),
    )


def _secret(json: bool, created: ServiceClientCreated) -> None:
    out = output(json)
    if out.json_mode:
        out.json(created)
        return
    out.table(created, [created], CLIENT_COLUMNS)
    out.error("the secret (shown once):")
    out.secret(created.secret)


@clients.command("create")
def create_client(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument()],
    model: Annotated[list[str] | None, typer.Option(help="a model it may call; repeatable")] = None,
    role: Annotated[list[str] | None, typer.Option(help="a role it may call; repeatable")] = None,
    max_concurrent: Annotated[int | None, typer.Option()] = None,
    rate_per_minute: Annotated[int | None, typer.Option()] = None,
    json: JsonOption = False,
) -> None:
    values: dict[str, Any] = {"name": name, "models": model or [], "roles": role or []}
    if max_concurrent is not None:
        values["max_concurrent"] = max_concurrent
    if rate_per_minute is not None:
        values["rate_per_minute"] = rate_per_minute
    body = ServiceClientCreate.model_validate(values)
    with admin(ctx).client() as client:
        created = client.post(ServiceClientCreated, SERVICE_CLIENTS, body)
    _secret(json, created)


@clients.command("list")
def list_clients(ctx: typer.Context, json: JsonOption = False) -> None:
    show_page(ctx, json, CLIENT_COLUMNS, lambda c: c.get(ServiceClientList, SERVICE_CLIENTS))


@clients.command("get")
def get_client(ctx: typer.Context, client_id: ClientArg, json: JsonOption = False) -> None:
    show_detail(ctx, json, lambda c: c.get(ServiceClientView, f"{SERVICE_CLIENTS}/{client_id}"))


@clients.command("rotate")
def rotate_client(ctx: typer.Context, client_id: ClientArg, json: JsonOption = False) -> None:
    with admin(ctx).client() as client:
        created = client.post(ServiceClientCreated, f"{SERVICE_CLIENTS}/{client_id}/rotate")
    _secret(json, created)


@clients.command("revoke")
def revoke_client(ctx: typer.Context, client_id: ClientArg, json: JsonOption = False) -> None:
    show_row(
        ctx,
        json,
        CLIENT_COLUMNS,
        lambda c: c.post(ServiceClientView, f"{SERVICE_CLIENTS}/{client_id}/revoke"),
    )


@app.command("watch")
def watch(
    ctx: typer.Context,
    deployment: DeploymentArg,
    until: Annotated[DeploymentState, typer.Option(help="exit 0 once it is in this state")] = (
        DeploymentState.READY
    ),
    json: JsonOption = False,
) -> None:
    """Follow a deployment (a model load, a drain) on the event stream: a line per state
    it passes through (its JSON with --json). Exits 0 in --until's state, 1 when it ends
    in another (failed, unloaded)."""
    out = output(json)
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
                        f"{view.model} on {view.node_id}/{view.device_id}: ",
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
