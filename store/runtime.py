"""Runtime rules shared by the API and the workers: profiles as immutable versions,
environments as the binaries nodes reported, the runtime workers' reports in sequence
order, and the runtime jobs (probe, health, unload) over the shared leases
(store/leases.py) with the results and the evidence their completion records."""

from __future__ import annotations

import uuid
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy import func, literal, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from schemas.artifacts import DigestAlgorithm
from schemas.errors import ErrorCode
from schemas.events import EventType, RuntimeProfileCreated
from schemas.jobs import JobKind
from schemas.llama_flags import endpoint_refusals
from schemas.protocol import StreamName
from schemas.runtime import (
    ArtifactRef,
    DeviceJobCreate,
    DeviceSpec,
    EnvironmentReport,
    LlamaSettings,
    ProbeComplete,
    ProbeCreate,
    ProbeResult,
    ProbeSpec,
    ResolvedLora,
    VerifiedFile,
)
from schemas.runtime_local import RuntimeReport
from store import artifacts, changes, leases, nodes
from store.errors import Conflict, Invalid
from store.models import Job, NodeArtifact, NodeStream
from store.runtime_tables import RuntimeEnvironment, RuntimeEvidence, RuntimeProfile

# First key of the advisory lock that numbers a profile name's versions: "mfrp".
_PROFILE_LOCK = 0x6D667270


# ------------------------------------------------------------------ profiles


async def create_profile(
    session: AsyncSession, name: str, settings: LlamaSettings, *, actor: str
) -> RuntimeProfile:
    """The next version of the named profile. Versions of one name are numbered under
    a lock on the name, so concurrent creations get distinct, gapless versions."""
    await session.execute(
        select(func.pg_advisory_xact_lock(_PROFILE_LOCK, func.hashtext(literal(name))))
    )
    latest = (
        await session.execute(
            select(func.max(RuntimeProfile.version)).where(RuntimeProfile.name == name)
        )
    ).scalar_one()
    profile = RuntimeProfile(
        id=uuid.uuid4(),
        name=name,
        version=(latest or 0) + 1,
        settings=settings.model_dump(mode="json"),
        created_at=await nodes.now(session),
    )
    session.add(profile)
    changes.record(
        session,
        EventType.RUNTIME_PROFILE_CREATED,
        RuntimeProfileCreated(profile_id=profile.id, name=name, version=profile.version),
        actor=actor,
    )
    return profile


async def profiles(session: AsyncSession, name: str | None = None) -> list[RuntimeProfile]:
    query = select(RuntimeProfile).order_by(RuntimeProfile.name, RuntimeProfile.version)
    if name is not None:
        query = query.where(RuntimeProfile.name == name)
    return list((await session.execute(query)).scalars().all())


async def environments(session: AsyncSession) -> list[RuntimeEnvironment]:
    query = select(RuntimeEnvironment).order_by(RuntimeEnvironment.first_reported_at)
    return list((await session.execute(query)).scalars().all())


# ------------------------------------------------------------------ reports


async def record_environments(
    session: AsyncSession, node_id: uuid.UUID, report: RuntimeReport, now: datetime
) -> None:
    """Every binary an applied runtime report lists becomes an environment the first
    time any node reports it (immutable from then on: identified by its digest)."""
    for binary in report.environments:
        await _environment(session, binary, node_id, now)


async def _environment(
    session: AsyncSession, binary: EnvironmentReport, node_id: uuid.UUID, now: datetime
) -> None:
    await session.execute(
        insert(RuntimeEnvironment)
        .values(
            id=uuid.uuid4(),
            binary_sha256=binary.binary_sha256,
            version=binary.version,
            backend=binary.backend,
            first_reported_at=now,
            first_node_id=node_id,
        )
        .on_conflict_do_nothing(index_elements=["binary_sha256"])
    )


async def node_runtime(session: AsyncSession, node_id: uuid.UUID) -> dict[str, Any] | None:
    """The node's last applied runtime report (devices, models, queues, binaries)."""
    payload = (
        await session.execute(
            select(NodeStream.good_payload).where(
                NodeStream.node_id == node_id, NodeStream.stream == StreamName.RUNTIME
            )
        )
    ).scalar_one_or_none()
    return payload


# ------------------------------------------------------------------ jobs


async def _artifact_file(
    session: AsyncSession, node_id: uuid.UUID, ref: ArtifactRef
) -> VerifiedFile:
    """The artifact file's absolute path on the node and its sha256, from the node's
    artifact inventory; 422 when the node has no such verified file, 409 when the only
    copies are being evicted (another root's copy is taken instead)."""
    evicting = await artifacts.evicting(session, node_id)
    evicted_by: uuid.UUID | None = None
    rows = (
        await session.execute(
            select(NodeArtifact).where(
                NodeArtifact.node_id == node_id,
                NodeArtifact.repository == ref.repository,
                NodeArtifact.commit == ref.commit,
            )
        )
    ).scalars()
    for artifact in rows:
        for entry in artifact.files:
            digest = entry.get("digest") or {}
            if entry.get("path") == ref.path and digest.get("algorithm") == DigestAlgorithm.SHA256:
                place = (artifact.root, artifact.repository, artifact.commit)
                if place in evicting:
                    evicted_by = evicting[place]
                    continue
                path = f"{artifact.root}/{artifact.repository}/{artifact.commit}/{ref.path}"
                return VerifiedFile(path=path, sha256=str(digest["value"]))
    if evicted_by is not None:
        raise Conflict(
            f"{ref.repository}@{ref.commit} is being evicted from the node",
            code=ErrorCode.STATE_CONFLICT,
            extra={"evicted_by": str(evicted_by)},
        )
    raise Invalid(
        f"the node has no verified copy of {ref.repository}@{ref.commit}:{ref.path} with a"
        " sha256 digest (acquire it with an artifact job first)",
        code=ErrorCode.ARTIFACT_NOT_ON_NODE,
    )


def admitted(profile: RuntimeProfile) -> LlamaSettings:
    """The profile's settings under today's allow-list: a profile stored before one of
    its flags was refused is refused for new probes (422, naming the flags)."""
    try:
        return LlamaSettings.model_validate(profile.settings)
    except ValidationError as exc:
        flags = [f for e in exc.errors() for f in (e.get("ctx") or {}).get("flags", [])]
        raise Invalid(
            f"runtime profile {profile.name} v{profile.version} is refused by the allow-list",
            code=ErrorCode.SERVER_FLAG_REFUSED,
            extra={"flags": flags},
        ) from None


def require_serves(
    profile: RuntimeProfile, settings: LlamaSettings, endpoints: Collection[str]
) -> None:
    """422 server_flag_refused when the profile sets a flag that what the load serves
    rules out (schemas/llama_flags.py: endpoint_refusals), at declaration rather than
    as a failed load on the node, which refuses it again."""
    if refusals := endpoint_refusals(settings.server_args, endpoints):
        raise Invalid(
            f"runtime profile {profile.name} v{profile.version} cannot serve"
            f" {', '.join(sorted(endpoints))}: " + "; ".join(r.reason for r in refusals),
            code=ErrorCode.SERVER_FLAG_REFUSED,
            extra={"flags": [r.flag for r in refusals]},
        )


@dataclass(frozen=True)
class ResolvedRun:
    """What a probe or a deployment loads on its node, resolved by the control plane:
    the profile under today's allow-list, the environment the node reports, and every
    file as the node's verified copy (path and digest)."""

    profile: RuntimeProfile
    environment: RuntimeEnvironment
    settings: LlamaSettings
    model: VerifiedFile
    draft_model: VerifiedFile | None
    loras: list[ResolvedLora]

    def lease_fields(self) -> dict[str, Any]:
        """What a probe's and a deployment load's lease both carry of it."""
        return {
            "artifact_path": self.model.path,
            "artifact_digest": self.model.sha256,
            "profile_id": self.profile.id,
            "profile_version": self.profile.version,
            "settings": self.settings.model_dump(mode="json"),
            "draft_model": self.draft_model,
            "loras": self.loras,
            "environment_id": self.environment.id,
            "binary_sha256": self.environment.binary_sha256,
        }


async def resolve_run(
    session: AsyncSession,
    node_id: uuid.UUID,
    artifact: ArtifactRef,
    profile_id: uuid.UUID,
    environment_id: uuid.UUID,
) -> ResolvedRun:
    """422 for an unknown profile or environment, an environment the node's runtime
    worker does not report, a profile the allow-list refuses, or a file the node has no
    verified copy of."""
    profile = await session.get(RuntimeProfile, profile_id)
    if profile is None:
        raise Invalid("no such runtime profile", code=ErrorCode.PROFILE_UNKNOWN)
    environment = await session.get(RuntimeEnvironment, environment_id)
    if environment is None:
        raise Invalid("no such runtime environment", code=ErrorCode.ENVIRONMENT_UNKNOWN)
    reported = await node_runtime(session, node_id)
    listed = (reported or {}).get("environments", [])
    binaries = {entry["binary_sha256"] for entry in listed}
    if environment.binary_sha256 not in binaries:
        raise Invalid(
            "the node's runtime worker does not report that environment's binary",
            code=ErrorCode.ENVIRONMENT_NOT_ON_NODE,
        )
    settings = admitted(profile)
    draft = settings.draft_model
    return ResolvedRun(
        profile=profile,
        environment=environment,
        settings=settings,
        model=await _artifact_file(session, node_id, artifact),
        draft_model=await _artifact_file(session, node_id, draft) if draft else None,
        loras=[
            ResolvedLora(
                **(await _artifact_file(session, node_id, lora.artifact)).model_dump(),
                scale=lora.scale,
            )
            for lora in settings.loras
        ],
    )


async def create_probe(session: AsyncSession, request: ProbeCreate, *, actor: str) -> Job:
    node = await nodes.schedulable(session, request.node_id, locked=True)
    run = await resolve_run(
        session, node.id, request.artifact, request.profile_id, request.environment_id
    )
    spec = ProbeSpec(**run.lease_fields(), device_id=request.device_id)
    return await leases.queue(
        session, JobKind.RUNTIME_PROBE, node.id, spec, request.max_attempts, actor=actor
    )


async def reported_devices(session: AsyncSession, node_id: uuid.UUID) -> list[str]:
    reported = await node_runtime(session, node_id)
    return [d.get("device_id") for d in (reported or {}).get("devices", [])]


def require_device(devices: list[str], device_id: str) -> None:
    if device_id not in devices:
        raise Invalid(
            "the node's runtime worker does not report that device",
            code=ErrorCode.DEVICE_NOT_ON_NODE,
            extra={"devices": devices},
        )


async def create_device_job(session: AsyncSession, request: DeviceJobCreate, *, actor: str) -> Job:
    """A runtime.health.v1 or runtime.unload.v1 job for a device the node's runtime
    worker reports (422 otherwise)."""
    node = await nodes.schedulable(session, request.node_id, locked=True)
    require_device(await reported_devices(session, node.id), request.device_id)
    return await leases.queue(
        session,
        JobKind(request.kind),
        node.id,
        DeviceSpec(device_id=request.device_id),
        request.max_attempts,
        actor=actor,
    )


def probe_spec(job: Job) -> ProbeSpec:
    return ProbeSpec.model_validate(job.spec)


async def complete_probe(
    session: AsyncSession, job: Job, report: ProbeComplete, now: datetime, *, actor: str
) -> None:
    """Record the evidence (the latest per node, device, artifact, profile and
    environment) and complete the job."""
    spec = probe_spec(job)
    health = report.health.model_dump(mode="json")
    evidence = report.evidence.model_dump(mode="json")
    await session.execute(
        insert(RuntimeEvidence)
        .values(
            node_id=job.node_id,
            device_id=report.device_id,
            artifact_digest=spec.artifact_digest,
            profile_id=spec.profile_id,
            environment_id=spec.environment_id,
            artifact_path=spec.artifact_path,
            health=health,
            evidence=evidence,
            job_id=job.id,
            recorded_at=now,
        )
        .on_conflict_do_update(
            index_elements=[
                "node_id",
                "device_id",
                "artifact_digest",
                "profile_id",
                "environment_id",
            ],
            set_={
                "health": health,
                "evidence": evidence,
                "job_id": job.id,
                "recorded_at": now,
                "artifact_path": spec.artifact_path,
            },
        )
    )
    result = ProbeResult(device_id=report.device_id, health=report.health, evidence=report.evidence)
    leases.complete(session, job, now, result=result, actor=actor)


async def evidence(session: AsyncSession, node_id: uuid.UUID | None) -> list[RuntimeEvidence]:
    query = select(RuntimeEvidence).order_by(RuntimeEvidence.recorded_at.desc())
    if node_id is not None:
        query = query.where(RuntimeEvidence.node_id == node_id)
    return list((await session.execute(query)).scalars().all())
