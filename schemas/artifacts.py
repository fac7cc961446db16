"""Artifact jobs: acquisition (artifact.acquire.v1) and eviction (artifact.evict.v1):
what an operator asks for, what a lease carries, and what a node reports.

A lease carries only a repository, an exact commit, the selected files with their
expected sizes and digests, an approved target root and a reserve policy: no URL, no
command, no free-form field. The node fetches `{endpoint}/{repository}/resolve/{commit}/
{path}` from the source it is configured with (the Hugging Face Hub layout) and
verifies each file against the digest the job holds.

A file's path is any safe relative path (schemas/base.py: FilePath; spaces, non-ASCII
letters, `~`, parentheses included), a root a narrow absolute one (RootPath); the node
checks again on its side (symlinks, the real root).

An eviction's lease carries the artifact as the node's inventory recorded it (its root,
repository, commit and every file's size and digest): the node deletes only files that
still match, under one of its roots, never through a symlink.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

from pydantic import Discriminator, Field, Strict, Tag, field_validator

from schemas.base import Count, FilePath, Number, RootPath, WireModel
from schemas.jobs import (
    Attempts,
    FailReport,
    JobClaim,
    JobFamily,
    JobKind,
    JobState,
    JobType,
    JobView,
    Lease,
    LeaseFence,
    RouteDocs,
)
from schemas.protocol import (
    ARTIFACT_JOB_COMPLETE,
    ARTIFACT_JOB_FAIL,
    ARTIFACT_JOB_PROGRESS,
    ARTIFACT_JOBS_NEXT,
)

# `owner/name` (or a bare `name`), as the Hub spells repository ids.
REPOSITORY_PATTERN: Final = (
    r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
    r"(?:/[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?)?$"
)
COMMIT_PATTERN: Final = r"^[0-9a-f]{40}$"
# A branch, a tag or a commit: `/`-separated segments, none starting with `.` or `-`.
REVISION_PATTERN: Final = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(?:/[A-Za-z0-9_][A-Za-z0-9_.-]*)*$"
# fnmatch-style selection of a repository's files: any character a file path may hold
# (schemas/base.py: FILE_PATH_PATTERN), and `*`, `?`, `[...]`.
FILE_GLOB_PATTERN: Final = r"^[^\\\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]{1,255}$"

Repository = Annotated[str, Strict(), Field(max_length=193, pattern=REPOSITORY_PATTERN)]
CommitId = Annotated[str, Strict(), Field(pattern=COMMIT_PATTERN)]
Revision = Annotated[str, Strict(), Field(max_length=255, pattern=REVISION_PATTERN)]
FileGlob = Annotated[str, Strict(), Field(pattern=FILE_GLOB_PATTERN)]
MAX_FILES: Final = 1000


class DigestAlgorithm(StrEnum):
    # An LFS file's `lfs.oid`: SHA-256 of the content.
    SHA256 = "sha256"
    # A small file's git blob id: SHA-1 of `blob <size>\0` + content.
    GIT_SHA1 = "git-sha1"


class Sha256Digest(WireModel):
    algorithm: Literal[DigestAlgorithm.SHA256]
    value: Annotated[str, Strict(), Field(pattern=r"^[0-9a-f]{64}$")]


class GitBlobDigest(WireModel):
    algorithm: Literal[DigestAlgorithm.GIT_SHA1]
    value: Annotated[str, Strict(), Field(pattern=r"^[0-9a-f]{40}$")]


FileDigest = Annotated[Sha256Digest | GitBlobDigest, Field(discriminator="algorithm")]


class ArtifactFile(WireModel):
    path: FilePath
    size: Count
    digest: FileDigest


def _unique_paths(files: list[ArtifactFile]) -> list[ArtifactFile]:
    paths = [f.path for f in files]
    if len(set(paths)) != len(paths):
        raise ValueError("each file path may appear once")
    return files


class ArtifactManifest(WireModel):
    """Exact: a commit and every selected file's size and digest."""

    repository: Repository
    commit: CommitId
    files: Annotated[
        list[ArtifactFile],
        Field(min_length=1, max_length=MAX_FILES, description="paths are unique"),
    ]

    _unique = field_validator("files")(_unique_paths)


class ManifestRequest(WireModel):
    """Resolved by the control plane: a revision and file patterns, turned into a
    manifest from the source's revision and tree API before the job is stored."""

    repository: Repository
    revision: Revision = "main"
    patterns: Annotated[list[FileGlob], Field(min_length=1, max_length=64)]


class ReservePolicy(WireModel):
    # Bytes that must stay free on the target root's filesystem, before and during.
    min_free_bytes: Count = 0


class JobTarget(WireModel):
    """Where and for whom: what every way of creating a job says."""

    node_id: uuid.UUID
    target_root: Annotated[
        RootPath, Field(description="one of the roots the node reports as allowed")
    ]
    reserve: ReservePolicy = Field(default_factory=ReservePolicy)
    max_attempts: Attempts = 3


class CreateFromManifest(JobTarget):
    """Exact: the commit and every file's size and digest are given."""

    manifest: ArtifactManifest


class CreateByRevision(JobTarget):
    """Resolved by the control plane from the source before the job is stored."""

    resolve: ManifestRequest


def _which_source(value: Any) -> str | None:
    if isinstance(value, dict):
        if "manifest" in value:
            return "manifest"
        return "resolve" if "resolve" in value else None
    return "manifest" if isinstance(value, CreateFromManifest) else "resolve"


# Exactly one of the two: the key present picks the form (so a refusal names that form's
# problem, not the other's), and each form refuses the other's key.
CreateArtifactJob = Annotated[
    Annotated[CreateFromManifest, Tag("manifest")] | Annotated[CreateByRevision, Tag("resolve")],
    Discriminator(_which_source),
]


class ArtifactPlace(WireModel):
    """An artifact's files under a root: `{target_root}/{repository}/{commit}/…`."""

    repository: Repository
    commit: CommitId
    files: Annotated[list[ArtifactFile], Field(max_length=MAX_FILES)]
    target_root: RootPath


class ArtifactSpec(ArtifactPlace):
    """Everything an acquisition's lease carries, and nothing else."""

    reserve: ReservePolicy


class EvictSpec(ArtifactPlace):
    """Everything an eviction's lease carries: the artifact as the node's inventory
    recorded it. The node deletes a file only when its size and digest still match."""


class EvictArtifact(WireModel):
    """POST …/nodes/{node_id}/artifacts/evict: one artifact of the node's inventory. The
    root may be left out when the node holds that commit under one root only."""

    repository: Repository
    commit: CommitId
    target_root: RootPath | None = None
    max_attempts: Attempts = 3


class FileProgress(WireModel):
    path: FilePath
    bytes_done: Count


class ProgressReport(WireModel):
    lease: LeaseFence
    files: Annotated[list[FileProgress], Field(max_length=MAX_FILES)]
    bytes_per_s: Annotated[Number, Field(ge=0)] | None = None


class CompleteReport(WireModel):
    """The verified inventory: what is now at `{root}/{repository}/{commit}/…`."""

    lease: LeaseFence
    files: Annotated[
        list[ArtifactFile],
        Field(min_length=1, max_length=MAX_FILES, description="paths are unique"),
    ]

    _unique = field_validator("files")(_unique_paths)


class EvictReport(CompleteReport):
    """An eviction's completion: the spec's files, none of them on the node any more
    (each verified and deleted, or already absent). Its `kind` tells it from an
    acquisition's report."""

    kind: Literal[JobKind.ARTIFACT_EVICT]


def _which_report(value: Any) -> str:
    if isinstance(value, dict):
        return str(value.get("kind", JobKind.ARTIFACT_ACQUIRE.value))
    kind = JobKind.ARTIFACT_EVICT if isinstance(value, EvictReport) else JobKind.ARTIFACT_ACQUIRE
    return kind.value


# The …/complete body: an acquisition's report has no `kind` (as before evictions existed).
ArtifactCompletion = Annotated[
    Annotated[CompleteReport, Tag(JobKind.ARTIFACT_ACQUIRE.value)]
    | Annotated[EvictReport, Tag(JobKind.ARTIFACT_EVICT.value)],
    Discriminator(_which_report),
]


class ArtifactProgressView(WireModel):
    bytes_done: int
    bytes_total: int
    files_done: int
    files_total: int
    bytes_per_s: float | None
    eta_s: float | None
    reported_at: datetime


class ArtifactResult(WireModel):
    """What a completed job established: the verified files are now (acquisition), or
    are no longer (eviction), at `{root}/{repository}/{commit}/…`, an entry of the node's
    artifact inventory."""

    root: str
    repository: str
    commit: str


class ArtifactJobView(JobView):
    kind: Literal[JobKind.ARTIFACT_ACQUIRE]
    spec: ArtifactSpec
    progress: ArtifactProgressView | None
    result: ArtifactResult | None


class EvictJobView(JobView):
    kind: Literal[JobKind.ARTIFACT_EVICT]
    spec: EvictSpec
    # An eviction reports no byte counts: its progress only keeps its lease.
    progress: None = None
    result: ArtifactResult | None


# An artifact job of any kind, as an operator sees it: the shared JobView, by `kind`.
ArtifactKindView = ArtifactJobView | EvictJobView
ArtifactJobAnswer = Annotated[ArtifactKindView, Field(discriminator="kind")]


class ArtifactJobList(WireModel):
    items: list[ArtifactJobAnswer]


class ArtifactClaim(WireModel):
    """GET …/artifact-jobs/next: one job of the calling node and its lease."""

    job_id: uuid.UUID
    kind: Literal[JobKind.ARTIFACT_ACQUIRE] = JobKind.ARTIFACT_ACQUIRE
    attempt: Attempts
    spec: ArtifactSpec
    lease: Lease


class EvictClaim(JobClaim):
    kind: Literal[JobKind.ARTIFACT_EVICT]
    spec: EvictSpec


# GET …/artifact-jobs/next: the job's kind's claim, by `kind`.
ArtifactJobClaim = Annotated[ArtifactClaim | EvictClaim, Field(discriminator="kind")]


class CompleteAnswer(WireModel):
    job_id: uuid.UUID
    # succeeded, or failed when the files did not match the job (inventory_mismatch).
    state: JobState
    mismatches: list[str] = []


ARTIFACT_FAMILY: Final = JobFamily(
    name="artifact",
    next=ARTIFACT_JOBS_NEXT,
    progress_path=ARTIFACT_JOB_PROGRESS,
    complete_path=ARTIFACT_JOB_COMPLETE,
    fail_path=ARTIFACT_JOB_FAIL,
    types=(
        JobType(
            kind=JobKind.ARTIFACT_ACQUIRE,
            spec=ArtifactSpec,
            claim=ArtifactClaim,
            completion=CompleteReport,
            result=ArtifactResult,
            view=ArtifactJobView,
            capability=JobKind.ARTIFACT_ACQUIRE.value,
        ),
        JobType(
            kind=JobKind.ARTIFACT_EVICT,
            capability=JobKind.ARTIFACT_EVICT.value,
            # What was evicted is said as what was acquired: the root, repository, commit.
            result=ArtifactResult,
            spec=EvictSpec,
            claim=EvictClaim,
            completion=EvictReport,
            view=EvictJobView,
        ),
    ),
    claim=ArtifactJobClaim,
    progress=ProgressReport,
    progress_view=ArtifactProgressView,
    completion=ArtifactCompletion,
    completed=CompleteAnswer,
    fail=FailReport,
    docs=RouteDocs(
        claim="""At most one of the calling node's queued jobs (an acquisition or an eviction,
    by `kind`), leased to it; 204 when none.""",
        progress="Bytes per file; extends the lease. The answer says whether to stop (cancelled).",
        complete="""The verified inventory. A match records the artifact on the node (an
    eviction's, with its `kind`: removes it); a mismatch fails the job (inventory_mismatch):
    either way the answer is 200 with the outcome.""",
        fail="A typed failure. Retried with backoff while it may help and attempts remain.",
    ),
)


class NodeArtifact(WireModel):
    """Where an artifact now is: the node's artifact inventory."""

    node_id: uuid.UUID
    root: str
    repository: str
    commit: str
    files: list[ArtifactFile]
    job_id: uuid.UUID
    recorded_at: datetime


class NodeArtifactList(WireModel):
    items: list[NodeArtifact]
