"""`modelforge admin services …`: model services (schemas/services.py), "serve this model,
N replicas". create, list, get, scale, rollout (and `rollout status`, `rollout undo`),
delete. A service is named by its id or by its served name (the one not deleted).

A create or a rollout is a body (-f, as `deployments create` reads one) or flags for the
common fields; either is checked against the wire model before anything is sent."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import TypeAdapter, ValidationError
from typer._click.core import Context as ClickContext
from typer.core import TyperGroup

from cli.admin.answers import answer, show_page
from cli.admin.bodies import ROLLOUT_BODY, SERVICE_BODY, read_body
from cli.admin.cells import endpoints
from cli.admin.client import AdminClient, AdminFailure
from cli.admin.context import FormatOption, JsonOption, admin, form, id_option, output
from cli.admin.help import group
from cli.admin.output import Column, Format, Output, size
from cli.admin.watch import follow_one
from schemas.endpoints import ENDPOINT_ORDER, Endpoints
from schemas.protocol import SERVICES
from schemas.services import (
    DeviceKind,
    ReplicaView,
    RolloutState,
    RolloutView,
    ServiceCreate,
    ServiceDetail,
    ServiceList,
    ServiceRollout,
    ServiceScale,
    ServiceState,
    ServiceTemplate,
    ServiceView,
)

app = group('Model services: "serve this model, N replicas".')


class _RolloutGroup(TyperGroup):
    """`rollout SERVICE …` starts one; `rollout status|undo SERVICE` are its others."""

    def parse_args(self, ctx: ClickContext, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["start", *args]
        return super().parse_args(ctx, args)


rollouts = group(
    "Roll out a new template: `rollout SERVICE [-f body | flags]`; `rollout status`, `undo`.",
    cls=_RolloutGroup,
)
app.add_typer(rollouts, name="rollout")

ServiceArg = Annotated[str, typer.Argument(help="the service's id or its served name")]
FileOption = Annotated[
    Path | None, typer.Option("--file", "-f", help="the request body (JSON; - for stdin)")
]
EndpointOption = Annotated[
    list[str] | None,
    typer.Option(
        "--endpoint",
        metavar="<endpoint>",
        help=f"what every replica serves: {', '.join(ENDPOINT_ORDER)}; repeatable",
    ),
]

SERVICE_COLUMNS: list[Column[ServiceView]] = [
    Column("ID", lambda s: s.id),
    Column("NAME", lambda s: s.name, flex=True),
    # What it serves: left out first where the row does not fit (a `get` has it).
    Column(
        "ENDPOINTS",
        lambda s: endpoints(s.template.endpoints),
        optional=True,
        full=lambda s: endpoints(s.template.endpoints, wide=True),
    ),
    Column("STATE", lambda s: s.state, styled=True),
    Column("READY", lambda s: f"{s.ready_replicas}/{s.replicas}"),
    Column("GEN", lambda s: s.generation),
    Column("ROLLOUT", lambda s: _rollout_cell(s.rollout)),
    Column("RECEIPT", lambda s: s.last_receipt.message if s.last_receipt else None, flex=True),
    Column("CREATED", lambda s: s.created_at, wide=True),
]
REPLICA_COLUMNS: list[Column[ReplicaView]] = [
    Column("REPLICA", lambda r: r.id),
    Column("GEN", lambda r: r.generation),
    Column("NODE", lambda r: r.node_id),
    Column("DEVICE", lambda r: r.device_id),
    Column("PHASE", lambda r: r.phase, styled=True),
    Column(
        "FAILURE",
        lambda r: f"{r.failure.code}: {r.failure.detail}" if r.failure else None,
        flex=True,
    ),
    Column("SINCE", lambda r: r.phase_changed_at),
]
ROLLOUT_COLUMNS: list[Column[RolloutView]] = [
    Column("STATE", lambda r: r.state, styled=True),
    Column("GEN", lambda r: r.generation),
    Column("UPDATED READY", lambda r: f"{r.updated_ready}/{r.desired}"),
    Column("OUTDATED", lambda r: r.outdated),
    Column("REASON", lambda r: r.reason, flex=True),
    Column("STARTED", lambda r: r.started_at),
]


# ------------------------------------------------------------------ commands


@app.command("create", epilog=SERVICE_BODY)
def create(
    ctx: typer.Context,
    file: FileOption = None,
    name: Annotated[str | None, typer.Option(help="the served model name")] = None,
    repository: Annotated[
        str | None, typer.Option(help="the Hugging Face repository (owner/name)")
    ] = None,
    revision: Annotated[str, typer.Option(help="resolved once to a commit")] = "main",
    path: Annotated[str | None, typer.Option(help="the GGUF file in the repository")] = None,
    profile: Annotated[uuid.UUID | None, id_option("the runtime profile's id")] = None,
    environment: Annotated[
        uuid.UUID | None, typer.Option(help="default: the one each node reports")
    ] = None,
    replicas: Annotated[int, typer.Option(help="how many to keep ready")] = 1,
    role: Annotated[list[str] | None, typer.Option(help="repeatable")] = None,
    selector: Annotated[list[str] | None, typer.Option(help="label key=value; repeatable")] = None,
    device_kind: Annotated[
        DeviceKind | None, typer.Option(help="only devices of this kind (default: any)")
    ] = None,
    max_per_node: Annotated[int, typer.Option(help="replicas on one node at most")] = 1,
    max_concurrent: Annotated[
        int | None, typer.Option(help="invokes one replica serves at once (default 4)")
    ] = None,
    endpoint: EndpointOption = None,
    json: JsonOption = False,
    fmt: FormatOption = None,
) -> None:
    """Declare a service: -f body.json, or at least --name, --repository, --path, --profile."""
    if file is not None:
        body = read_body(file, ServiceCreate)
    else:
        missing = [
            flag
            for flag, value in (
                ("--name", name),
                ("--repository", repository),
                ("--path", path),
                ("--profile", profile),
            )
            if value is None
        ]
        if missing:
            raise typer.BadParameter(f"give -f, or {', '.join(missing)}")
        values: dict[str, Any] = {
            "name": name,
            "roles": role or [],
            "artifact": {"repository": repository, "revision": revision, "path": path},
            "profile_id": str(profile),
            "environment_id": str(environment) if environment else None,
            "replicas": replicas,
            "placement": {
                "selector": _labels(selector or []),
                "device_kind": device_kind.value if device_kind else None,
                "max_per_node": max_per_node,
            },
        }
        if max_concurrent is not None:
            values["max_concurrent"] = max_concurrent
        if endpoint:
            values["endpoints"] = _endpoints(endpoint)
        body = ServiceCreate.model_validate(values)
    view = answer(ctx, lambda c: c.call(ServiceDetail, "POST", SERVICES, body=body))
    _show(output(json, fmt), view)


@app.command("list")
def list_services(
    ctx: typer.Context,
    state: Annotated[list[ServiceState] | None, typer.Option(help="repeatable")] = None,
    name: Annotated[str | None, typer.Option(help="only the service of this name")] = None,
    json: JsonOption = False,
    fmt: FormatOption = None,
) -> None:
    """The services, newest first: ready/desired replicas, rollout, last receipt."""
    show_page(
        ctx,
        form(json, fmt),
        SERVICE_COLUMNS,
        lambda c: c.get(ServiceList, SERVICES, state=state, name=name),
    )


@app.command("get")
def get(
    ctx: typer.Context,
    service: ServiceArg,
    ended: Annotated[bool, typer.Option(help="ended replicas too")] = False,
    json: JsonOption = False,
    fmt: FormatOption = None,
) -> None:
    """The service, its replicas and its last placement receipt in full."""
    view = answer(
        ctx,
        lambda c: c.get(
            ServiceDetail, f"{SERVICES}/{_id(c, service)}", ended="true" if ended else None
        ),
    )
    _show(output(json, fmt), view)


@app.command("scale")
def scale(
    ctx: typer.Context,
    service: ServiceArg,
    replicas: Annotated[int, typer.Argument(help="the desired count")],
    json: JsonOption = False,
    fmt: FormatOption = None,
) -> None:
    """Set the desired replicas: more are placed, the surplus drains."""
    body = ServiceScale.model_validate({"replicas": replicas})
    _act(ctx, form(json, fmt), service, "scale", body)


@rollouts.command("start", epilog=ROLLOUT_BODY)
def rollout(
    ctx: typer.Context,
    service: ServiceArg,
    file: FileOption = None,
    revision: Annotated[
        str | None, typer.Option(help="a new revision of the same repository and file")
    ] = None,
    repository: Annotated[
        str | None, typer.Option(help="the Hugging Face repository (owner/name)")
    ] = None,
    path: Annotated[str | None, typer.Option(help="the GGUF file in the repository")] = None,
    profile: Annotated[uuid.UUID | None, id_option("the runtime profile's id")] = None,
    environment: Annotated[uuid.UUID | None, id_option("the runtime environment's id")] = None,
    max_concurrent: Annotated[
        int | None, typer.Option(help="invokes one replica serves at once (default 4)")
    ] = None,
    endpoint: EndpointOption = None,
    json: JsonOption = False,
    fmt: FormatOption = None,
) -> None:
    """Roll out a new template, replacing the replicas one at a time.

    The template is what the flags or the body name, the rest kept. `rollout status`
    follows it."""
    with admin(ctx).client() as client:
        service_id = _id(client, service)
        if file is not None:
            body = read_body(file, ServiceRollout)
        else:
            values: dict[str, Any] = {}
            if revision is not None or repository is not None or path is not None:
                current = client.get(ServiceDetail, f"{SERVICES}/{service_id}").template
                values["artifact"] = {
                    "repository": repository or current.artifact.repository,
                    "revision": revision or current.artifact.revision,
                    "path": path or current.artifact.path,
                }
            if profile is not None:
                values["profile_id"] = str(profile)
            if environment is not None:
                values["environment_id"] = str(environment)
            if max_concurrent is not None:
                values["max_concurrent"] = max_concurrent
            if endpoint:
                values["endpoints"] = _endpoints(endpoint)
            if not values:
                raise typer.BadParameter(
                    "give -f, or what changes: --revision, --repository, --path, --profile,"
                    " --environment, --max-concurrent, --endpoint"
                )
            body = ServiceRollout.model_validate(values)
        view = client.call(ServiceDetail, "POST", f"{SERVICES}/{service_id}/rollout", body=body)
    _show(output(json, fmt), view)


@rollouts.command("status")
def rollout_status(
    ctx: typer.Context,
    service: ServiceArg,
    watch: Annotated[
        bool,
        typer.Option("--watch", "-w", help="follow until complete (exit 0) or stopped (exit 1)"),
    ] = False,
    json: JsonOption = False,
    fmt: FormatOption = None,
) -> None:
    """The rollout's progress: updated ready replicas of those desired, outdated ones.

    Updated: of the current generation; outdated: of an earlier one, still live."""
    out = output(json, fmt)
    with admin(ctx).client() as client:
        service_id = _id(client, service)
        path = f"{SERVICES}/{service_id}/rollout"
        if not watch:
            view = client.get(RolloutView, path)
            out.table(view, [view], ROLLOUT_COLUMNS)
            return
        shown: list[RolloutView] = []

        def read() -> RolloutView:
            view = client.get(RolloutView, path)
            if not shown or shown[-1] != view:
                shown.append(view)
                if out.json_mode:
                    out.json(view)
                else:
                    out.line(_rollout_line(view))
            return view

        final = follow_one(
            client,
            out,
            target=service_id,
            read=read,
            done=lambda view: view.state is not RolloutState.PROGRESSING,
            type="service.",
        )
    if final.state is not RolloutState.COMPLETE:
        raise typer.Exit(1)


@rollouts.command("undo")
def rollout_undo(
    ctx: typer.Context, service: ServiceArg, json: JsonOption = False, fmt: FormatOption = None
) -> None:
    """Back to the previous template, as a new generation; its replicas still live stay."""
    _act(ctx, form(json, fmt), service, "rollout/undo")


@app.command("delete")
def delete(
    ctx: typer.Context, service: ServiceArg, json: JsonOption = False, fmt: FormatOption = None
) -> None:
    """Every replica drains, then the service is deleted (its name free again)."""
    with admin(ctx).client() as client:
        service_id = _id(client, service)
        view = client.call(ServiceDetail, "DELETE", f"{SERVICES}/{service_id}")
    _show(output(json, fmt), view)


# ------------------------------------------------------------------ helpers


def _act(
    ctx: typer.Context,
    how: Format,
    service: str,
    action: str,
    body: ServiceScale | None = None,
) -> None:
    with admin(ctx).client() as client:
        service_id = _id(client, service)
        view = client.post(ServiceDetail, f"{SERVICES}/{service_id}/{action}", body)
    _show(output(how), view)


def _id(client: AdminClient, service: str) -> uuid.UUID:
    """An id as it is; a name as the id of the service not deleted that serves it."""
    try:
        return uuid.UUID(service)
    except ValueError:
        pass
    live = [ServiceState.ACTIVE, ServiceState.DELETING]
    found = client.get(ServiceList, SERVICES, name=service, state=live).items
    if not found:
        raise AdminFailure(f"no service named {service!r}")
    return found[0].id


def _endpoints(items: list[str]) -> list[str]:
    """--endpoint's values as the wire model takes them, or a usage error (exit 2)."""
    try:
        return list(TypeAdapter(Endpoints).validate_python(items))
    except ValidationError:
        raise typer.BadParameter(
            f"--endpoint {' '.join(items)}: give {', '.join(ENDPOINT_ORDER)}, each at most once"
        ) from None


def _labels(items: list[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{item!r}: give key=value")
        labels[key] = value
    return labels


def _rollout_cell(rollout: RolloutView) -> str:
    if rollout.state is RolloutState.COMPLETE:
        return "complete"
    return f"{rollout.state.value} {rollout.updated_ready}/{rollout.desired}"


def _rollout_line(view: RolloutView) -> str:
    line = (
        f"generation {view.generation}: {view.state.value}, {view.updated_ready} of"
        f" {view.desired} updated and ready, {view.outdated} outdated"
    )
    return f"{line} ({view.reason})" if view.reason else line


def _template(template: ServiceTemplate) -> list[tuple[str, object]]:
    artifact = template.artifact
    estimate = template.estimate
    return [
        ("artifact", f"{artifact.repository}@{artifact.commit}:{artifact.path}"),
        ("revision", artifact.revision),
        ("size", size(artifact.size_bytes)),
        ("profile", f"{template.profile_id} (v{template.profile_version})"),
        ("environment", template.environment_id or "each node's"),
        ("endpoints", template.endpoints),
        ("max concurrent", template.max_concurrent),
        (
            "estimate",
            f"{size(estimate.total_bytes)} ({estimate.source})" if estimate else None,
        ),
    ]


def _show(out: Output, view: ServiceDetail) -> None:
    """The service as labelled keys, its replicas as a table, its last receipt whole."""
    if out.json_mode:
        out.json(view)
        return
    placement = view.placement
    out.detail(
        view,
        [
            ("id", view.id),
            ("name", view.name),
            ("roles", view.roles),
            ("state", view.state),
            ("replicas", f"{view.ready_replicas} ready of {view.replicas}"),
            ("generation", view.generation),
            ("rollout", _rollout_line(view.rollout)),
            *_template(view.template),
            (
                "autoscale",
                f"{view.autoscale.min_replicas}..{view.autoscale.max_replicas}"
                if view.autoscale
                else None,
            ),
            ("selector", placement.selector),
            ("device kind", placement.device_kind),
            ("max per node", placement.max_per_node),
            ("created", view.created_at),
            ("updated", view.updated_at),
        ],
    )
    if view.items:
        out.rows(view.items, REPLICA_COLUMNS, title="replicas")
    else:
        out.line("no replicas")
    receipt = view.last_receipt
    if receipt is not None:
        out.line(f"last placement ({receipt.outcome}): ", receipt.message)
