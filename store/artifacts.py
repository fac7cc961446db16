"""Artifact jobs: the kind-specific rules over the shared leases (store/leases.py).
An acquisition: creation against the node's allowed roots, progress with milestone
events, and the completion check that turns a verified file list into the node's
artifact inventory. An eviction: creation from that inventory, refused while anything
on the node uses the artifact, and the completion that takes it out of the inventory."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from schemas.artifacts import (
    ArtifactFile,
    ArtifactManifest,
    ArtifactPlace,
    ArtifactResult,
    ArtifactSpec,
    CompleteReport,
    EvictArtifact,
    EvictSpec,
    JobTarget,
    ProgressReport,
)
from schemas.deployments import ENDED_STATES
from schemas.errors import ErrorCode
from schemas.events import EventType
from schemas.jobs import FailureCode, JobKind, JobState
from schemas.protocol import StreamName
from store import changes, leases, nodes
from store.deployments.tables import Deployment
from store.errors import Conflict, Invalid, Missing
from store.models import Job, Node, NodeArtifact, NodeStream

MILESTONES = (25, 50, 75)


async def allowed_roots(session: AsyncSession, node_id: uuid.UUID) -> list[str]:
    """The artifact roots in the node's last accepted inventory (its agent config)."""
    payload = (
        await session.execute(
            select(NodeStream.good_payload).where(
                NodeStream.node_id == node_id, NodeStream.stream == StreamName.INVENTORY
            )
        )
    ).scalar_one_or_none()
    roots = ((payload or {}).get("host") or {}).get("artifact_roots") or []
    return [str(root) for root in roots]


async def check_schedulable(
    session: AsyncSession, node_id: uuid.UUID, target_root: str, *, lock: bool = False
) -> Node:
    """The node, if a job for it may be created (nodes.schedulable), and only for a
    root the node offers (422)."""
    node = await nodes.schedulable(session, node_id, locked=lock)
    roots = await allowed_roots(session, node.id)
    if target_root not in roots:
        raise Invalid(
            "the target root is not one the node allows (its agent config's artifact_roots,"
            " reported in its inventory)",
            code=ErrorCode.TARGET_ROOT_NOT_ALLOWED,
            extra={"allowed_roots": roots},
        )
    return node


async def create(
    session: AsyncSession, request: JobTarget, manifest: ArtifactManifest, *, actor: str
) -> Job:
    """A queued job for the node; checked again under the node lock (a disable or a
    decommission may have committed since the caller's first check)."""
    node = await check_schedulable(session, request.node_id, request.target_root, lock=True)
    place = (request.target_root, manifest.repository, manifest.commit)
    # An eviction queued or running would delete what this writes.
    await _refuse_users(session, node.id, place, kinds=(JobKind.ARTIFACT_EVICT,), deployments=False)
    spec = ArtifactSpec(
        repository=manifest.repository,
        commit=manifest.commit,
        files=manifest.files,
        target_root=request.target_root,
        reserve=request.reserve,
    )
    return await leases.queue(
        session, JobKind.ARTIFACT_ACQUIRE, node.id, spec, request.max_attempts, actor=actor
    )


# Evictions ------------------------------------------------------------------------------

# (root, repository, commit): where an artifact is on its node.
Place = tuple[str, str, str]


async def _recorded(
    session: AsyncSession, node_id: uuid.UUID, request: EvictArtifact
) -> NodeArtifact:
    """The inventory entry an eviction names (404 for none; 422 when it is under several
    roots and the request names none)."""
    query = select(NodeArtifact).where(
        NodeArtifact.node_id == node_id,
        NodeArtifact.repository == request.repository,
        NodeArtifact.commit == request.commit,
    )
    if request.target_root is not None:
        query = query.where(NodeArtifact.root == request.target_root)
    rows = list((await session.execute(query)).scalars().all())
    if not rows:
        raise Missing(
            f"the node's inventory has no {request.repository}@{request.commit}"
            + (f" under {request.target_root}" if request.target_root else ""),
            code=ErrorCode.ARTIFACT_NOT_ON_NODE,
        )
    if len(rows) > 1:
        raise Invalid(
            "the node holds that commit under several roots: name one (target_root)",
            code=ErrorCode.VALIDATION_FAILED,
            extra={"roots": sorted(row.root for row in rows)},
        )
    return rows[0]


def _paths(spec: dict[str, Any]) -> list[str]:
    """The node files a runtime or deployment spec loads (schemas/runtime.py: ProbeSpec,
    schemas/deployments.py: LoadSpec): the model, its draft model and its LoRAs."""
    draft = spec.get("draft_model") or {}
    paths = [spec.get("artifact_path"), draft.get("path")]
    paths += [lora.get("path") for lora in spec.get("loras") or []]
    return [str(path) for path in paths if path]


def _uses(spec: dict[str, Any], place: Place) -> bool:
    """Whether a spec (a job's, or a deployment's resolved load) loads a file of the
    artifact at `place`, or is an artifact job on the same place."""
    root, repository, commit = place
    prefix = f"{root}/{repository}/{commit}/"
    if (spec.get("target_root"), spec.get("repository"), spec.get("commit")) == place:
        return True
    return any(path.startswith(prefix) for path in _paths(spec))


async def _refuse_users(
    session: AsyncSession,
    node_id: uuid.UUID,
    place: Place,
    *,
    kinds: tuple[JobKind, ...],
    deployments: bool = True,
) -> None:
    """409 while a queued or leased job of `kinds` uses the artifact at `place`, or
    (`deployments`) a deployment that has not ended loads one of its files. The node's
    lock, taken by the caller, keeps new ones out until this transaction ends."""
    users: list[str] = []
    if deployments:
        running = select(Deployment).where(
            Deployment.node_id == node_id,
            Deployment.state.not_in([state.value for state in ENDED_STATES]),
        )
        users += [
            f"deployment {deployment.id} ({deployment.state})"
            for deployment in (await session.execute(running)).scalars()
            if _uses(deployment.spec, place)
        ]
    users += [
        f"job {job.id} ({job.kind}, {job.state})"
        for job in (
            await session.execute(
                select(Job).where(
                    Job.node_id == node_id,
                    Job.kind.in_([kind.value for kind in kinds]),
                    Job.state.in_([JobState.QUEUED.value, JobState.LEASED.value]),
                )
            )
        ).scalars()
        if _uses(job.spec, place)
    ]
    if users:
        root, repository, commit = place
        raise Conflict(
            f"{repository}@{commit} under {root} is in use on the node",
            code=ErrorCode.STATE_CONFLICT,
            extra={"used_by": sorted(users)[:20]},
        )


async def evicting(session: AsyncSession, node_id: uuid.UUID) -> dict[Place, uuid.UUID]:
    """The places of the node's artifacts that a queued or leased eviction is deleting,
    each with its job. A probe or a load resolving a file under one of them is refused
    (store/runtime.py), as create_eviction refuses while one uses it: the node's lock,
    which both callers hold, orders the two."""
    jobs = await session.execute(
        select(Job).where(
            Job.node_id == node_id,
            Job.kind == JobKind.ARTIFACT_EVICT.value,
            Job.state.in_([JobState.QUEUED.value, JobState.LEASED.value]),
        )
    )
    return {
        (job.spec["target_root"], job.spec["repository"], job.spec["commit"]): job.id
        for job in jobs.scalars()
    }


async def create_eviction(
    session: AsyncSession, node_id: uuid.UUID, request: EvictArtifact, *, actor: str
) -> Job:
    """A queued eviction of one artifact of the node's inventory, carrying its files as
    recorded; refused while anything on the node uses it (409)."""
    node = await nodes.schedulable(session, node_id, locked=True)
    artifact = await _recorded(session, node.id, request)
    place = (artifact.root, artifact.repository, artifact.commit)
    # Every kind: a runtime or deployment job loading one of its files, or another
    # artifact job on the same place (an acquisition would write what this deletes).
    await _refuse_users(session, node.id, place, kinds=tuple(JobKind))
    spec = EvictSpec(
        repository=artifact.repository,
        commit=artifact.commit,
        files=[ArtifactFile.model_validate(entry) for entry in artifact.files],
        target_root=artifact.root,
    )
    return await leases.queue(
        session, JobKind.ARTIFACT_EVICT, node.id, spec, request.max_attempts, actor=actor
    )


def spec_of(job: Job) -> ArtifactSpec:
    return ArtifactSpec.model_validate(job.spec)


def record_progress(
    session: AsyncSession, job: Job, report: ProgressReport, now: datetime, *, actor: str
) -> None:
    """Store the latest per-file byte counts (bounded by each file's size); an event
    only when the total crosses a milestone, not for every report. An eviction's report
    only keeps its lease: it has no bytes to count."""
    if job.kind == JobKind.ARTIFACT_EVICT:
        return
    spec = spec_of(job)
    sizes = {f.path: f.size for f in spec.files}
    unknown = [p.path for p in report.files if p.path not in sizes]
    if unknown:
        raise Invalid(
            "progress names files that are not in the job",
            code=ErrorCode.VALIDATION_FAILED,
            extra={"unknown_files": unknown[:10]},
        )
    previous: dict[str, Any] = job.progress or {}
    done_by_file = dict(previous.get("files", {}))
    for entry in report.files:
        done_by_file[entry.path] = min(entry.bytes_done, sizes[entry.path])
    total = sum(sizes.values())
    done = sum(done_by_file.values())
    before = int(previous.get("bytes_done", 0))
    job.progress = {
        "files": done_by_file,
        "bytes_done": done,
        "bytes_total": total,
        "files_done": sum(1 for path, size in sizes.items() if done_by_file.get(path) == size),
        "files_total": len(sizes),
        "bytes_per_s": report.bytes_per_s,
        "reported_at": now.isoformat(),
    }
    if total > 0:
        for percent in MILESTONES:
            if before * 100 < percent * total <= done * 100:
                changes.record(
                    session,
                    EventType.JOB_PROGRESSED,
                    leases.event(job, percent=percent),
                    actor=actor,
                )


def _mismatches(expected: list[ArtifactFile], reported: list[ArtifactFile]) -> list[str]:
    want = {f.path: f for f in expected}
    got = {f.path: f for f in reported}
    problems = [f"{path}: missing" for path in sorted(want.keys() - got.keys())]
    problems += [f"{path}: not in the job" for path in sorted(got.keys() - want.keys())]
    for path in sorted(want.keys() & got.keys()):
        if want[path].size != got[path].size:
            problems.append(f"{path}: size {got[path].size}, expected {want[path].size}")
        elif want[path].digest != got[path].digest:
            problems.append(f"{path}: digest differs")
    return problems


async def complete(
    session: AsyncSession,
    job: Job,
    report: CompleteReport,
    now: datetime,
    policy: leases.LeasePolicy,
    *,
    actor: str,
) -> list[str]:
    """Check the verified inventory against the job. A match records where the artifact
    now is (an eviction: removes it) and completes the job; a mismatch fails it
    (inventory_mismatch, final). The mismatches, empty on success."""
    spec: ArtifactPlace = (
        EvictSpec.model_validate(job.spec) if job.kind == JobKind.ARTIFACT_EVICT else spec_of(job)
    )
    problems = _mismatches(spec.files, report.files)
    if problems:
        leases.fail(
            session,
            job,
            now,
            policy,
            code=FailureCode.INVENTORY_MISMATCH,
            retryable=False,
            detail="; ".join(problems)[:500],
            actor=actor,
        )
        return problems
    result = ArtifactResult(root=spec.target_root, repository=spec.repository, commit=spec.commit)
    if isinstance(spec, EvictSpec):
        await session.execute(
            delete(NodeArtifact).where(
                NodeArtifact.node_id == job.node_id,
                NodeArtifact.root == spec.target_root,
                NodeArtifact.repository == spec.repository,
                NodeArtifact.commit == spec.commit,
            )
        )
        leases.complete(session, job, now, result=result, actor=actor)
        return []
    files = [f.model_dump(mode="json") for f in spec.files]
    await session.execute(
        insert(NodeArtifact)
        .values(
            node_id=job.node_id,
            root=spec.target_root,
            repository=spec.repository,
            commit=spec.commit,
            files=files,
            job_id=job.id,
            recorded_at=now,
        )
        .on_conflict_do_update(
            index_elements=["node_id", "root", "repository", "commit"],
            set_={"files": files, "job_id": job.id, "recorded_at": now},
        )
    )
    leases.complete(session, job, now, result=result, actor=actor)
    return []


async def node_artifacts(session: AsyncSession, node_id: uuid.UUID) -> list[NodeArtifact]:
    return list(
        (
            await session.execute(
                select(NodeArtifact)
                .where(NodeArtifact.node_id == node_id)
                .order_by(NodeArtifact.repository, NodeArtifact.commit, NodeArtifact.root)
            )
        )
        .scalars()
        .all()
    )
