"""`modelforge admin runtime …`: runtime profiles and environments, probes (runtime
jobs of every kind) and the evidence they recorded."""

from __future__ import annotations

import json as json_module
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.admin.answers import answer, show_page, show_row
from cli.admin.bodies import read_body
from cli.admin.context import JsonOption, output
from cli.admin.listing import list_command
from cli.admin.output import Column
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

app = typer.Typer(help="runtime profiles, environments, probes and evidence")
profiles = typer.Typer(help="runtime profiles (llama-server settings, versioned)")
environments = typer.Typer(help="runtime environments (llama-server binaries nodes reported)")
probes = typer.Typer(help="runtime jobs: probe, health, unload")
app.add_typer(profiles, name="profiles")
app.add_typer(environments, name="environments")
app.add_typer(probes, name="probes")

FileArg = Annotated[Path, typer.Option("--file", "-f", help="the request body (JSON; - for stdin)")]

PROFILE_COLUMNS: list[Column[RuntimeProfileView]] = [
    Column("ID", lambda p: p.id),
    Column("NAME", lambda p: p.name),
    Column("VERSION", lambda p: p.version),
    Column("CREATED", lambda p: p.created_at),
]
ENVIRONMENT_COLUMNS: list[Column[RuntimeEnvironmentView]] = [
    Column("ID", lambda e: e.id),
    Column("VERSION", lambda e: e.version),
    Column("BACKEND", lambda e: e.backend),
    Column("BINARY SHA256", lambda e: e.binary_sha256[:16]),
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
    Column("FAILURE", lambda j: j.failure.code if j.failure else None),
    Column("UPDATED", lambda j: j.updated_at),
]
EVIDENCE_COLUMNS: list[Column[EvidenceView]] = [
    Column("NODE", lambda e: e.node_id),
    Column("DEVICE", lambda e: e.device_id),
    Column("ARTIFACT", lambda e: e.artifact_path),
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
) -> None:
    show_page(
        ctx, json, PROFILE_COLUMNS, lambda c: c.get(RuntimeProfileList, RUNTIME_PROFILES, name=name)
    )


@profiles.command("get")
def get_profile(ctx: typer.Context, profile: uuid.UUID, json: JsonOption = False) -> None:
    view = answer(ctx, lambda c: c.get(RuntimeProfileView, f"{RUNTIME_PROFILES}/{profile}"))
    settings = json_module.dumps(view.settings, sort_keys=True)
    output(json).detail(
        view, [*view.model_dump(exclude={"settings"}).items(), ("settings", settings)]
    )


@profiles.command("create")
def create_profile(ctx: typer.Context, file: FileArg, json: JsonOption = False) -> None:
    """A profile (or its next version) from a JSON body; refused flags are named."""
    body = read_body(file, ProfileCreate)
    show_row(
        ctx,
        json,
        PROFILE_COLUMNS,
        lambda c: c.call(RuntimeProfileView, "POST", RUNTIME_PROFILES, body=body),
    )


@environments.command("list")
def list_environments(ctx: typer.Context, json: JsonOption = False) -> None:
    show_page(
        ctx,
        json,
        ENVIRONMENT_COLUMNS,
        lambda c: c.get(RuntimeEnvironmentList, RUNTIME_ENVIRONMENTS),
    )


probes.command("list")(list_command(RuntimeJobList, RUNTIME_JOBS, JOB_COLUMNS))


def _job_answer(method: str, path: str, ctx: typer.Context, json: bool, body: Any = None) -> None:
    response = answer(ctx, lambda c: c.request(method, path, body=body))
    # One job of any runtime kind: the list model reads it by its `kind`.
    found = RuntimeJobList.model_validate_json(b'{"items":[' + response.content + b"]}")
    job: JobView = found.items[0]
    output(json).table(job, [job], JOB_COLUMNS)


@probes.command("get")
def get_probe(ctx: typer.Context, job: uuid.UUID, json: JsonOption = False) -> None:
    _job_answer("GET", f"{RUNTIME_JOBS}/{job}", ctx, json)


@probes.command("create")
def create_probe(ctx: typer.Context, file: FileArg, json: JsonOption = False) -> None:
    """A probe (or, by `kind`, a health or unload job) from a JSON body."""
    body = read_body(file, RuntimeJobCreate)
    _job_answer("POST", RUNTIME_JOBS, ctx, json, body.model_dump(mode="json", exclude_unset=True))


@probes.command("cancel")
def cancel_probe(ctx: typer.Context, job: uuid.UUID, json: JsonOption = False) -> None:
    _job_answer("POST", f"{RUNTIME_JOBS}/{job}/cancel", ctx, json, {})


@app.command("evidence")
def evidence(
    ctx: typer.Context,
    node: Annotated[uuid.UUID | None, typer.Option()] = None,
    json: JsonOption = False,
) -> None:
    """The latest probe evidence per node, device, artifact, profile and environment."""
    show_page(
        ctx, json, EVIDENCE_COLUMNS, lambda c: c.get(EvidenceList, RUNTIME_EVIDENCE, node_id=node)
    )
