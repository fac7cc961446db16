"""Rows to admin wire models. Jobs of every kind are shown through one builder
(job_view): the fields JobView shares are read the same way for all of them, and each
kind adds only its typed spec, progress and result.

A job that ended shows what it ended with, not the last progress report it was sent
(the reports stop short of the end: the last one may say 98 %, or a load's "loading"):
a succeeded acquisition shows all its files, a phase is shown only while the job runs.
The API, the CLI and the dashboard all read these views, so they agree."""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypeVar

from schemas.admin import (
    GpuInfo,
    InventoryView,
    Liveness,
    NodeDetail,
    NodeSummary,
    StreamState,
    TelemetryView,
)
from schemas.agent import NotAppliedReason
from schemas.artifacts import ARTIFACT_FAMILY, ArtifactKindView, ArtifactProgressView, ArtifactSpec
from schemas.deployments import (
    DEPLOYMENT_FAMILY,
    DeploymentFailure,
    DeploymentKindView,
    DeploymentState,
    DeploymentView,
)
from schemas.endpoints import ChatTemplateCaps
from schemas.jobs import JobFailureView, JobFamily, JobKind, JobState, JobView, LeaseView
from schemas.protocol import StreamName
from schemas.runtime import RUNTIME_FAMILY, ArtifactRef, RuntimeKindView, RuntimeProgressView
from store import leases, results
from store.deployments.tables import Deployment
from store.models import Gpu, Job, Node, NodeStream

V = TypeVar("V", bound=JobView)


def node_summary(node: Node, liveness: str) -> NodeSummary:
    return NodeSummary(
        id=node.id,
        hostname=node.hostname,
        display_name=node.display_name,
        labels=dict(node.labels),
        enabled=node.enabled,
        liveness=Liveness(liveness),
        agent_version=node.agent_version,
        protocol_version=node.protocol_version,
        enrolled_at=node.enrolled_at,
        last_heartbeat_at=node.last_heartbeat_at,
        decommissioned_at=node.decommissioned_at,
    )


def stream_state(stream: NodeStream | None) -> StreamState | None:
    if stream is None:
        return None
    return StreamState(
        cursor=stream.cursor,
        good_sequence=stream.good_sequence,
        good_observed_at=stream.good_observed_at,
        good_received_at=stream.good_received_at,
        not_applied_reason=NotAppliedReason(stream.not_applied_reason)
        if stream.not_applied_reason
        else None,
        not_applied_sequence=stream.not_applied_sequence,
        not_applied_observed_at=stream.not_applied_observed_at,
        not_applied_received_at=stream.not_applied_received_at,
    )


def gpu_info(gpu: Gpu) -> GpuInfo:
    return GpuInfo(
        uuid=gpu.uuid,
        index=gpu.index,
        name=gpu.name,
        pci_bus_id=gpu.pci_bus_id,
        memory_total_bytes=gpu.memory_total_bytes,
        driver_version=gpu.driver_version,
        cuda_version=gpu.cuda_version,
        first_seen_at=gpu.first_seen_at,
        last_seen_at=gpu.last_seen_at,
        missing=gpu.missing_since is not None,
        missing_since=gpu.missing_since,
    )


def node_detail(
    node: Node,
    liveness: str,
    streams: dict[str, NodeStream],
    gpus: list[Gpu],
    has_active_credential: bool,
) -> NodeDetail:
    inventory = streams.get(StreamName.INVENTORY)
    telemetry = streams.get(StreamName.TELEMETRY)
    return NodeDetail(
        **node_summary(node, liveness).model_dump(),
        capabilities=list(node.capabilities),
        has_active_credential=has_active_credential,
        inventory=InventoryView.model_validate(inventory.good_payload)
        if inventory and inventory.good_payload
        else None,
        inventory_stream=stream_state(inventory),
        telemetry=TelemetryView.model_validate(telemetry.good_payload)
        if telemetry and telemetry.good_payload
        else None,
        telemetry_stream=stream_state(telemetry),
        gpus=[gpu_info(gpu) for gpu in gpus],
    )


# Jobs -------------------------------------------------------------------------------------


def job_view(view: type[V], job: Job, **kind_parts: Any) -> V:
    """The job as its kind's view: the shared fields, then `kind_parts` (spec, progress,
    result) as that kind types them."""
    return view(
        id=job.id,
        kind=JobKind(job.kind),
        node_id=job.node_id,
        state=JobState(job.state),
        attempt=job.attempt,
        max_attempts=job.max_attempts,
        available_at=job.available_at,
        lease=(
            LeaseView(epoch=job.lease_epoch, expires_at=job.lease_expires_at)
            if job.state == JobState.LEASED and job.lease_expires_at is not None
            else None
        ),
        cancel_requested=job.cancel_requested_at is not None,
        failure=(
            JobFailureView(
                code=job.failure_code,
                retryable=bool(job.failure_retryable),
                detail=job.failure_detail or "",
            )
            if job.failure_code
            else None
        ),
        created_at=job.created_at,
        updated_at=job.updated_at,
        finished_at=job.finished_at,
        **kind_parts,
    )


def _ended(job: Job) -> bool:
    return job.state in leases.FINISHED


def family_job_view(family: JobFamily, job: Job) -> JobView:
    """The job as its kind's view, as its family declares it: the kind's spec, its
    progress as the family shows it, and its result typed by the kind's declaration."""
    declared = family.of(job.kind)
    spec = declared.spec.model_validate(job.spec)
    progress = _artifact_progress(job, spec) if isinstance(spec, ArtifactSpec) else _phase(job)
    return job_view(
        declared.view, job, spec=spec, progress=progress, result=results.read(job, declared.result)
    )


def artifact_job_view(job: Job) -> ArtifactKindView:
    view = family_job_view(ARTIFACT_FAMILY, job)
    assert isinstance(view, ArtifactKindView)
    return view


def runtime_job_view(job: Job) -> RuntimeKindView:
    view = family_job_view(RUNTIME_FAMILY, job)
    assert isinstance(view, RuntimeKindView)
    return view


def deployment_job_view(job: Job) -> DeploymentKindView:
    view = family_job_view(DEPLOYMENT_FAMILY, job)
    assert isinstance(view, DeploymentKindView)
    return view


def _artifact_progress(job: Job, spec: ArtifactSpec) -> ArtifactProgressView | None:
    """The last report while the job runs. Once it succeeded, every file of its spec is
    there (its completion verified them all), whatever the last report said; one that
    failed or was cancelled keeps where it got to, with no rate or time left."""
    if job.state == JobState.SUCCEEDED:
        total = sum(entry.size for entry in spec.files)
        return ArtifactProgressView(
            bytes_done=total,
            bytes_total=total,
            files_done=len(spec.files),
            files_total=len(spec.files),
            bytes_per_s=None,
            eta_s=None,
            reported_at=job.finished_at or job.updated_at,
        )
    progress = job.progress
    if not progress:
        return None
    done = int(progress["bytes_done"])
    total = int(progress["bytes_total"])
    rate = progress.get("bytes_per_s")
    rate_f = float(rate) if rate is not None and not _ended(job) else None
    return ArtifactProgressView(
        bytes_done=done,
        bytes_total=total,
        files_done=int(progress["files_done"]),
        files_total=int(progress["files_total"]),
        bytes_per_s=rate_f,
        eta_s=(total - done) / rate_f if rate_f else None,
        reported_at=datetime.fromisoformat(progress["reported_at"]),
    )


def _phase(job: Job) -> RuntimeProgressView | None:
    """A runtime or deployment job's progress: the phase it is in now; none once it
    ended (its state, result or failure say how)."""
    if not job.progress or _ended(job):
        return None
    return RuntimeProgressView.model_validate(job.progress)


# Deployments --------------------------------------------------------------------------------


def deployment_view(deployment: Deployment) -> DeploymentView:
    return DeploymentView(
        id=deployment.id,
        model=deployment.model,
        roles=list(deployment.roles),
        endpoints=list(deployment.endpoints),
        node_id=deployment.node_id,
        device_id=deployment.device_id,
        artifact=ArtifactRef.model_validate(deployment.artifact),
        profile_id=deployment.profile_id,
        profile_version=deployment.profile_version,
        environment_id=deployment.environment_id,
        state=DeploymentState(deployment.state),
        max_concurrent=deployment.max_concurrent,
        capabilities=(
            ChatTemplateCaps.model_validate(deployment.capabilities)
            if deployment.capabilities
            else None
        ),
        failure=(
            DeploymentFailure(code=deployment.failure_code, detail=deployment.failure_detail or "")
            if deployment.failure_code
            else None
        ),
        queue_depth=deployment.queue_depth,
        cooldown_until=deployment.cooldown_until,
        cooldown_reason=deployment.cooldown_reason,
        drain_deadline_s=deployment.drain_deadline_s,
        job_id=deployment.job_id,
        created_at=deployment.created_at,
        updated_at=deployment.updated_at,
        state_changed_at=deployment.state_changed_at,
    )
