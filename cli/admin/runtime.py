"""`modelforge admin runtime …`: runtime profiles and environments, probes (runtime
jobs of every kind) and the evidence they recorded."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.admin.answers import answer, show_page, show_row
from cli.admin.bodies import PROBE_BODY, PROFILE_BODY, read_body
from cli.admin.context import FormatOption, JsonOption, form, id_argument, id_option, output
from cli.admin.help import group
from cli.admin.listing import list_command
from cli.admin.output import Column, Format, fields_of
from schemas.jobs import JobView
from schemas.protocol import RUNTIME_ENVIRONMENTS, RUNTIME_EVIDENCE, RUNTIME_JOBS, RUNTIME_PROFILES
from schemas.runtime import (
    EvidenceList,
    EvidenceView,
    ProfileCreate,
    RuntimeEnvironmentList,
    RuntimeEnvironmentView,
    RuntimeJobCreate,
    RuntimeJobList,
    RuntimeProfileList,
    RuntimeProfileView,
)

app = group("Runtime: profiles, environments, probes and their evidence.")
profiles = group("Runtime profiles: llama-server settings, versioned.")
environments = group("Runtime environments: the llama-server binaries nodes reported.")
probes = group("Runtime jobs: probe, health, unload.")
app.add_typer(profiles, name="profiles")
app.add_typer(environments, name="environments")
app.add_typer(probes, name="probes")

FileArg = Annotated[Path, typer.Option("--file", "-f", help="the request body (JSON; - for stdin)")]

PROFILE_COLUMNS: list[Column[RuntimeProfileView]] = [
    Column("ID", lambda p: p.id),
    Column("NAME", lambda p: p.name, flex=True),
    Column("VERSION", lambda p: p.version),
    Column("CREATED", lambda p: p.created_at),
]
ENVIRONMENT_COLUMNS: list[Column[RuntimeEnvironmentView]] = [
    Column("ID", lambda e: e.id),
    Column("VERSION", lambda e: e.version, flex=True),
    Column("BACKEND", lambda e: e.backend),
    Column("BINARY SHA256", lambda e: e.binary_sha256[:12], full=lambda e: e.binary_sha256),
    Column("FIRST NODE", lambda e: e.first_node_id),
    Column("FIRST REPORTED", lambda e: e.first_reported_at),
]
# The shared JobView: every kind's row reads the same (the kinds differ in spec/result).
JOB_COLUMNS: list[Column[Any]] = [
    Column("ID", lambda j: j.id),
    Column("KIND", lambda j: j.kind),
    Column("NODE", lambda j: j.node_id),
    Column("STATE", lambda j: j.state, styled=True),
    Column("ATTEMPT", lambda j: f"{j.attempt}/{j.max_attempts}"),
    Column("FAILURE", lambda j: j.failure.code if j.failure else None, flex=True),
    Column("UPDATED", lambda j: j.updated_at),
    Column("CREATED", lambda j: j.created_at, wide=True),
]
EVIDENCE_COLUMNS: list[Column[EvidenceView]] = [
    Column("NODE", lambda e: e.node_id),
    Column("DEVICE", lambda e: e.device_id),
    Column("ARTIFACT", lambda e: e.artifact_path, flex=True),
    Column("PROFILE", lambda e: e.profile_id),
    Column("ENVIRONMENT", lambda e: e.environment_id),
    Column("JOB", lambda e: e.job_id),
    Column("RECORDED", lambda e: e.recorded_at),
]


@profiles.command("list")
def list_profiles(
    ctx: typer.Context,
    name: Annotated[str | None, typer.Option(help="only this profile's versions")] = None,
    json: JsonOption = False,
    fmt: FormatOption = None,
) -> None:
    """The runtime profiles, each version."""
    show_page(
        ctx,
        form(json, fmt),
        PROFILE_COLUMNS,
        lambda c: c.get(RuntimeProfileList, RUNTIME_PROFILES, name=name),
    )


@profiles.command("get")
def get_profile(
    ctx: typer.Context,
    profile: Annotated[uuid.UUID, id_argument("the profile's id")],
    json: JsonOption = False,
    fmt: FormatOption = None,
) -> None:
    """One runtime profile version and the settings it sets."""
    view = answer(ctx, lambda c: c.get(RuntimeProfileView, f"{RUNTIME_PROFILES}/{profile}"))
    # Those set, as key=value (wrapped between them): the whole JSON, a dozen nulls in
    # it, was one line of ~250 characters folded anywhere. -o json has every one.
    settings = {k: v for k, v in view.settings.items() if v not in (None, {}, [])}
    shown = [(k, v) for k, v in fields_of(view) if k != "settings"]
    output(json, fmt).detail(view, [*shown, ("settings", settings)])


@profiles.command("create", epilog=PROFILE_BODY)
def create_profile(
    ctx: typer.Context, file: FileArg, json: JsonOption = False, fmt: FormatOption = None
) -> None:
    """A profile (or its next version) from a JSON body; refused flags are named."""
    body = read_body(file, ProfileCreate)
    show_row(
        ctx,
        form(json, fmt),
        PROFILE_COLUMNS,
        lambda c: c.call(RuntimeProfileView, "POST", RUNTIME_PROFILES, body=body),
    )


@environments.command("list")
def list_environments(
    ctx: typer.Context, json: JsonOption = False, fmt: FormatOption = None
) -> None:
    """The runtime environments (llama-server builds) nodes reported."""
    show_page(
        ctx,
        form(json, fmt),
        ENVIRONMENT_COLUMNS,
        lambda c: c.get(RuntimeEnvironmentList, RUNTIME_ENVIRONMENTS),
    )


probes.command("list")(
    list_command(
        RuntimeJobList,
        RUNTIME_JOBS,
        JOB_COLUMNS,
        "The runtime jobs: probes, health checks, unloads.",
    )
)


def _job_answer(
    method: str,
    path: str,
    ctx: typer.Context,
    how: Format,
    body: Any = None,
    *,
    detail: bool = False,
) -> None:
    """One runtime job: a table's row, or (detail, as `get` shows one) its labelled keys."""
    response = answer(ctx, lambda c: c.request(method, path, body=body))
    # One job of any runtime kind: the list model reads it by its `kind`.
    found = RuntimeJobList.model_validate_json(b'{"items":[' + response.content + b"]}")
    job: JobView = found.items[0]
    if detail:
        output(how).detail(job, fields_of(job))
    else:
        output(how).table(job, [job], JOB_COLUMNS)


@probes.command("get")
def get_probe(
    ctx: typer.Context,
    job: Annotated[uuid.UUID, id_argument("the job's id")],
    json: JsonOption = False,
    fmt: FormatOption = None,
) -> None:
    """One runtime job (a probe, health check or unload)."""
    _job_answer("GET", f"{RUNTIME_JOBS}/{job}", ctx, form(json, fmt), detail=True)


@probes.command("create", epilog=PROBE_BODY)
def create_probe(
    ctx: typer.Context, file: FileArg, json: JsonOption = False, fmt: FormatOption = None
) -> None:
    """A probe (or, by `kind`, a health or unload job) from a JSON body."""
    body = read_body(file, RuntimeJobCreate)
    _job_answer(
        "POST", RUNTIME_JOBS, ctx, form(json, fmt), body.model_dump(mode="json", exclude_unset=True)
    )


@probes.command("cancel")
def cancel_probe(
    ctx: typer.Context,
    job: Annotated[uuid.UUID, id_argument("the job's id")],
    json: JsonOption = False,
    fmt: FormatOption = None,
) -> None:
    """Cancel a runtime job: a queued one at once, a running one on its next report."""
    _job_answer("POST", f"{RUNTIME_JOBS}/{job}/cancel", ctx, form(json, fmt), {})


@app.command("evidence")
def evidence(
    ctx: typer.Context,
    node: Annotated[uuid.UUID | None, id_option("only this node's")] = None,
    json: JsonOption = False,
    fmt: FormatOption = None,
) -> None:
    """The latest probe evidence per node, device, artifact, profile and environment."""
    show_page(
        ctx,
        form(json, fmt),
        EVIDENCE_COLUMNS,
        lambda c: c.get(EvidenceList, RUNTIME_EVIDENCE, node_id=node),
    )
