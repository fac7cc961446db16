"""`modelforge admin jobs …`: artifact jobs (a model's files acquired onto a node, or
evicted from it): create, evict, list, get, watch with a progress bar, cancel."""

from __future__ import annotations

import uuid
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated

import typer
from pydantic import RootModel, TypeAdapter, ValidationError
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from cli.admin.answers import answer, show_row
from cli.admin.client import AdminClient, AdminFailure
from cli.admin.context import FormatOption, JsonOption, admin, form, id_argument, id_option, output
from cli.admin.help import group
from cli.admin.listing import list_command
from cli.admin.output import Column, Output
from cli.admin.watch import follow_one
from cli.terminal import visible
from schemas.artifacts import (
    ArtifactJobAnswer,
    ArtifactJobList,
    ArtifactJobView,
    ArtifactKindView,
    ArtifactManifest,
    CreateArtifactJob,
    EvictArtifact,
)
from schemas.jobs import TERMINAL_STATES, JobState
from schemas.protocol import ARTIFACT_JOBS, NODES

app = group("Artifact jobs: a model's files acquired onto a node, or evicted from it.")

JobArg = Annotated[uuid.UUID, id_argument("the job's id")]


class ArtifactJob(RootModel[ArtifactJobAnswer]):
    """One artifact job of any kind (an acquisition, an eviction), read by its `kind`."""


def _percent(job: ArtifactKindView) -> str | None:
    if job.progress is None:
        return None
    p = job.progress
    return f"{100 * p.bytes_done / p.bytes_total if p.bytes_total else 100.0:.0f}%"


def _progress(job: ArtifactKindView) -> str | None:
    p = job.progress
    return None if p is None else f"{_percent(job)} ({p.files_done}/{p.files_total} files)"


JOB_COLUMNS: list[Column[ArtifactKindView]] = [
    Column("ID", lambda j: j.id),
    Column("KIND", lambda j: j.kind.value.split(".")[1]),
    Column("NODE", lambda j: j.node_id),
    Column("STATE", lambda j: j.state, styled=True),
    Column(
        "REPOSITORY",
        lambda j: j.spec.repository,
        flex=True,
        full=lambda j: f"{j.spec.repository}@{j.spec.commit}",
    ),
    Column("PROGRESS", _percent, full=_progress),
    Column("FAILURE", lambda j: j.failure.code if j.failure else None, flex=True),
    Column("UPDATED", lambda j: j.updated_at),
    Column("ROOT", lambda j: j.spec.target_root, wide=True),
    Column("ATTEMPT", lambda j: f"{j.attempt}/{j.max_attempts}", wide=True),
    Column("CREATED", lambda j: j.created_at, wide=True),
]


@app.command("create")
def create(
    ctx: typer.Context,
    node: Annotated[uuid.UUID, id_option("the node to acquire onto")],
    root: Annotated[str, typer.Option(help="one of the node's artifact roots")],
    manifest: Annotated[
        Path | None, typer.Option(help="an exact manifest (JSON: repository, commit, files)")
    ] = None,
    repository: Annotated[str | None, typer.Option(help="resolve this repository…")] = None,
    revision: Annotated[str, typer.Option(help="…at this revision")] = "main",
    pattern: Annotated[list[str] | None, typer.Option(help="…these files; repeatable")] = None,
    max_attempts: Annotated[
        int, typer.Option(min=1, max=20, help="tries before the job fails (1-20)")
    ] = 3,
    json: JsonOption = False,
    fmt: FormatOption = None,
) -> None:
    """Queue an acquisition: a model's files onto one of a node's artifact roots.

    From an exact --manifest (JSON: repository, commit, files), or by --repository,
    --revision and --pattern, which the control plane resolves to one first."""
    target = {"node_id": str(node), "target_root": root, "max_attempts": max_attempts}
    if (manifest is None) == (repository is None):
        raise typer.BadParameter("give --manifest, or --repository with --pattern")
    if manifest is not None:
        try:
            exact = ArtifactManifest.model_validate_json(manifest.read_bytes())
        except (OSError, ValidationError) as exc:
            raise AdminFailure(f"{manifest}: not a manifest ({type(exc).__name__})") from None
        body = {**target, "manifest": exact.model_dump(mode="json")}
    else:
        if not pattern:
            raise typer.BadParameter("--repository needs at least one --pattern")
        body = {
            **target,
            "resolve": {"repository": repository, "revision": revision, "patterns": pattern},
        }

    def create(client: AdminClient) -> ArtifactJobView:
        # Validated here as the API will: a mistake is a usage line, not a round trip.
        request = TypeAdapter(CreateArtifactJob).validate_python(body)
        return client.call(
            ArtifactJobView, "POST", ARTIFACT_JOBS, body=request.model_dump(mode="json")
        )

    show_row(ctx, form(json, fmt), JOB_COLUMNS, create)


@app.command("evict")
def evict(
    ctx: typer.Context,
    node: Annotated[uuid.UUID, id_argument("the node to evict it from")],
    artifact: Annotated[
        str, typer.Argument(help="REPOSITORY@COMMIT (a full commit), from `nodes artifacts`")
    ],
    root: Annotated[
        str | None, typer.Option(help="its root, where the node holds it under several")
    ] = None,
    max_attempts: Annotated[
        int, typer.Option(min=1, max=20, help="tries before the job fails (1-20)")
    ] = 3,
    json: JsonOption = False,
    fmt: FormatOption = None,
) -> None:
    """Queue an eviction: the node deletes the artifact's files from its root.

    Only the files that still match its inventory are deleted (never through a
    symlink), and the artifact leaves the inventory. Refused while a deployment, or a
    queued or leased job, uses it."""
    repository, _, commit = artifact.rpartition("@")
    try:
        # Checked here as the API will: a mistake is a usage line, not a round trip.
        request = EvictArtifact(
            repository=repository, commit=commit, target_root=root, max_attempts=max_attempts
        )
    except ValidationError as exc:
        field = ".".join(str(part) for part in exc.errors()[0]["loc"])
        raise typer.BadParameter(
            f"not REPOSITORY@COMMIT with a full 40-hex commit and an absolute --root ({field})"
        ) from None
    path = f"{NODES}/{node}/artifacts/evict"
    show_row(
        ctx,
        form(json, fmt),
        JOB_COLUMNS,
        lambda c: c.call(ArtifactJob, "POST", path, body=request).root,
    )


app.command("list")(
    list_command(
        ArtifactJobList,
        ARTIFACT_JOBS,
        JOB_COLUMNS,
        "The artifact jobs: node, state, progress, failure.",
    )
)


@app.command("get")
def get_job(
    ctx: typer.Context, job: JobArg, json: JsonOption = False, fmt: FormatOption = None
) -> None:
    """One artifact job: its files, root, progress, failure and result."""
    _show(
        output(json, fmt), answer(ctx, lambda c: c.get(ArtifactJob, f"{ARTIFACT_JOBS}/{job}").root)
    )


def _show(out: Output, view: ArtifactKindView) -> None:
    out.detail(
        view,
        [
            ("id", view.id),
            ("node", view.node_id),
            ("kind", view.kind),
            ("state", view.state),
            ("cancel requested", view.cancel_requested),
            ("repository", f"{view.spec.repository}@{view.spec.commit}"),
            ("files", len(view.spec.files)),
            ("root", view.spec.target_root),
            ("attempt", f"{view.attempt}/{view.max_attempts}"),
            ("progress", _progress(view)),
            ("failure", f"{view.failure.code}: {view.failure.detail}" if view.failure else None),
            ("result", view.result.root if view.result else None),
            ("created", view.created_at),
            ("finished", view.finished_at),
        ],
    )


@app.command("cancel")
def cancel(
    ctx: typer.Context, job: JobArg, json: JsonOption = False, fmt: FormatOption = None
) -> None:
    """A queued job ends at once; a running one is told on its next progress report."""
    show_row(
        ctx,
        form(json, fmt),
        JOB_COLUMNS,
        lambda c: c.post(ArtifactJob, f"{ARTIFACT_JOBS}/{job}/cancel").root,
    )


@app.command("watch")
def watch(
    ctx: typer.Context, job: JobArg, json: JsonOption = False, fmt: FormatOption = None
) -> None:
    """Follow one job to its end with a progress bar of its bytes.

    With -o json, the job's JSON on each change. Exits 0 when it succeeds, 1 when it
    fails or is cancelled."""
    out = output(json, fmt)
    with admin(ctx).client() as client, _bar(out) as bar:
        task = bar.add_task(str(job), total=None) if bar is not None else None

        def read() -> ArtifactKindView:
            view = client.get(ArtifactJob, f"{ARTIFACT_JOBS}/{job}").root
            if out.json_mode:
                out.json(view)
            elif bar is not None and task is not None:
                # The total is known from the spec before the first report; a job that
                # succeeded has all of it, reported or not.
                total = sum(f.size for f in view.spec.files)
                done = view.progress.bytes_done if view.progress else 0
                if view.state is JobState.SUCCEEDED:
                    done = total
                bar.update(
                    task,
                    description=visible(f"{view.spec.repository} [{view.state.value}]"),
                    completed=done,
                    total=total,
                )
            return view

        # Read once the stream is open, so no change falls between the two.
        final = follow_one(
            client,
            out,
            target=job,
            read=read,
            done=lambda view: view.state in TERMINAL_STATES,
            type="job.",
        )
    if not out.json_mode:
        _show(out, final)
    if final.state is not JobState.SUCCEEDED:
        raise typer.Exit(1)


def _bar(out: Output) -> Progress | nullcontext[None]:
    if out.json_mode:
        return nullcontext()
    return Progress(
        # The description is data (a repository's name): shown as written, never markup.
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=out.console,
        transient=False,
    )
