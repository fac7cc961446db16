"""Artifact acquisition jobs: the kind-specific rules over the shared leases
(store/leases.py): creation against the node's allowed roots, progress with milestone
events, and the completion check that turns a verified file list into the node's
artifact inventory."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from schemas.artifacts import (
    ArtifactFile,
    ArtifactManifest,
    ArtifactResult,
    ArtifactSpec,
    CompleteReport,
    JobTarget,
    ProgressReport,
)
from schemas.errors import ErrorCode
from schemas.events import EventType
from schemas.jobs import FailureCode, JobKind
from schemas.protocol import StreamName
from store import changes, leases, nodes
from store.errors import Invalid
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


def spec_of(job: Job) -> ArtifactSpec:
    return ArtifactSpec.model_validate(job.spec)


def record_progress(
    session: AsyncSession, job: Job, report: ProgressReport, now: datetime, *, actor: str
) -> None:
    """Store the latest per-file byte counts (bounded by each file's size); an event
    only when the total crosses a milestone, not for every report."""
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
    now is and completes the job; a mismatch fails it (inventory_mismatch, final). The
    mismatches, empty on success."""
    spec = spec_of(job)
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
    result = ArtifactResult(root=spec.target_root, repository=spec.repository, commit=spec.commit)
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
