"""The runtime's settings and identities: LlamaSettings (a configured model's and a
RuntimeProfile's llama-server settings), RuntimeProfile and RuntimeEnvironment, and the
runtime jobs' probe input, health and evidence."""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Discriminator,
    Field,
    Strict,
    Tag,
    WithJsonSchema,
)
from pydantic_core import PydanticCustomError

from schemas.artifacts import CommitId, Repository
from schemas.base import (
    SAFE_INT_MAX,
    Count,
    FilePath,
    Flag,
    Integer,
    NodePath,
    Note,
    Number,
    Positive,
    Text,
    WireModel,
    json_integer,
)
from schemas.jobs import (
    Attempts,
    JobFamily,
    JobKind,
    JobState,
    JobType,
    JobView,
    Lease,
    LeaseFence,
    RouteDocs,
)
from schemas.llama_flags import profile_refusals, server_args_json_schema
from schemas.protocol import (
    RUNTIME_JOB_COMPLETE,
    RUNTIME_JOB_FAIL,
    RUNTIME_JOB_PROGRESS,
    RUNTIME_JOBS_NEXT,
)

# A `server_args` entry's value: a scalar, each one argv element (never a shell string).
ServerArg = Flag | Integer | Number | Annotated[Text, Field(max_length=256)]
SERVER_FLAG_REFUSED: Final = "server_flag_refused"


def _allowed_only(server_args: dict[str, Any]) -> dict[str, Any]:
    """The allow-list (schemas/llama_flags.py): a refusal names every flag it refuses."""
    refusals = profile_refusals(server_args)
    if refusals:
        raise PydanticCustomError(
            SERVER_FLAG_REFUSED,
            "{reasons}",
            {
                "reasons": "; ".join(r.reason for r in refusals),
                "flags": [r.flag for r in refusals],
            },
        )
    return server_args


# A RuntimeProfile's `server_args`: only what the allow-list admits, with its bounds.
ProfileServerArgs = Annotated[
    dict[Annotated[str, Strict(), Field(max_length=64)], ServerArg],
    Field(max_length=64),
    AfterValidator(_allowed_only),
    WithJsonSchema(server_args_json_schema()),
]
Share = Annotated[Number, Field(ge=0)]
# Whole numbers within their own bounds (a bound on an alias of Count would not reach
# the JSON Schema: the inner one wins there).
PositiveCount = Annotated[
    int, Strict(), Field(ge=1, le=SAFE_INT_MAX), BeforeValidator(json_integer)
]
ThreadCount = Annotated[int, Strict(), Field(ge=1, le=4096), BeforeValidator(json_integer)]
GpuLayers = Annotated[int, Strict(), Field(ge=-1, le=100_000), BeforeValidator(json_integer)]
GpuIndex = Annotated[int, Strict(), Field(ge=0, le=1024), BeforeValidator(json_integer)]
LoraScale = Annotated[Number, Field(ge=-10, le=10)]
ChatTemplate = Literal["model", "chatml-tools"]


class LlamaTuning(WireModel):
    """The structured llama-server settings, shared by a RuntimeProfile and every model
    the node's own config serves."""

    ctx_size: Count | None = None
    batch_size: PositiveCount | None = None
    ubatch_size: PositiveCount | None = None
    threads: ThreadCount | None = None
    threads_batch: ThreadCount | None = None
    # -1: all layers.
    gpu_layers: GpuLayers | None = None
    main_gpu: GpuIndex | None = None
    tensor_split: Annotated[list[Share], Field(min_length=1, max_length=64)] | None = None
    flash_attn: Flag | None = None
    # The chat template: the model's own, or one the runtime worker ships
    # (agent/runtime/templates/): `chatml-tools` is ChatML with Hermes/Qwen2.5-style
    # `<tool_call>` tools, for ChatML models whose own template cannot call tools. A
    # name, never a path or template text.
    chat_template: ChatTemplate = "model"


class ArtifactRef(WireModel):
    """An artifact file in the node's inventory (recorded by a completed artifact job)."""

    repository: Repository
    commit: CommitId
    path: FilePath


class LoraRef(WireModel):
    artifact: ArtifactRef
    scale: LoraScale = 1.0


class LlamaSettings(LlamaTuning):
    """A RuntimeProfile's content: the structured settings, the allow-listed flags, and
    the files a profile may add, as artifacts (resolved on the node to verified files,
    never a path from the control plane)."""

    server_args: ProfileServerArgs = Field(default_factory=dict)
    draft_model: ArtifactRef | None = None
    loras: Annotated[list[LoraRef], Field(max_length=8)] = Field(default_factory=list)


# Profiles and environments -----------------------------------------------------------


ProfileName = Annotated[
    str, Strict(), Field(min_length=1, max_length=100, pattern=r"^[a-z0-9][a-z0-9._-]*$")
]


class ProfileCreate(WireModel):
    """POST …/runtime/profiles: the next version of the profile of that name (a change
    is a new version, never an edit)."""

    name: ProfileName
    settings: LlamaSettings


# A profile's settings as stored, read back without the allow-list: a profile stored
# before a flag was refused must still list (probes with it are refused, 422).
StoredSettings = dict[str, Any]


class RuntimeProfileView(WireModel):
    id: uuid.UUID
    name: str
    version: int
    settings: StoredSettings
    created_at: datetime


Sha256Hex = Annotated[str, Strict(), Field(pattern=r"^[0-9a-f]{64}$")]


class EnvironmentReport(WireModel):
    """A llama-server binary the runtime worker has: its digest and what it says its
    version is."""

    binary_sha256: Sha256Hex
    version: Annotated[Text, Field(min_length=1, max_length=200)]
    backend: Literal["cpu", "cuda"]


class RuntimeEnvironmentView(WireModel):
    """Immutable: identified by the binary's digest; first reported by a node."""

    id: uuid.UUID
    binary_sha256: str
    version: str
    backend: str
    first_reported_at: datetime
    first_node_id: uuid.UUID


# Probes --------------------------------------------------------------------------------


class RuntimeFailure(StrEnum):
    BINARY_MISSING = "binary_missing"
    BINARY_DIGEST_MISMATCH = "binary_digest_mismatch"
    ARTIFACT_MISSING = "artifact_missing"
    ARTIFACT_DIGEST_MISMATCH = "artifact_digest_mismatch"
    STARTUP_TIMEOUT = "startup_timeout"
    PROCESS_EXITED = "process_exited"
    OUT_OF_MEMORY = "out_of_memory"
    INFERENCE_FAILED = "inference_failed"
    UNSUPPORTED_BACKEND = "unsupported_backend"
    # The profile carries what the node's allow-list refuses: nothing was started.
    PROFILE_REFUSED = "profile_refused"
    # The device serves a deployment (pinned to its model until that is unloaded).
    DEVICE_PINNED = "device_pinned"
    # Embeddings are served but the model pools nothing (llama-server: "Pooling type
    # 'none' is not OAI compatible"): the profile must set `pooling`.
    EMBEDDINGS_UNAVAILABLE = "embeddings_unavailable"
    CANCELLED = "cancelled"
    INTERNAL = "internal"


# The fixed technical probe input: the same for every probe, so evidence compares.
PROBE_PROMPT: Final = "Reply with the single word: ready."
PROBE_MAX_TOKENS: Final = 8
DeviceId = Annotated[str, Strict(), Field(pattern=r"^(cpu|gpu:[0-9]{1,4})$")]


# The runtime kinds that name only a device: health and unload.
DeviceKind = Literal[JobKind.RUNTIME_HEALTH, JobKind.RUNTIME_UNLOAD]


class ProbeCreate(WireModel):
    """POST …/runtime/probes (the default kind). The control plane resolves the artifact
    to its exact path and digest on the node; the job carries nothing else but
    identities."""

    kind: Literal[JobKind.RUNTIME_PROBE] = JobKind.RUNTIME_PROBE
    node_id: uuid.UUID
    artifact: ArtifactRef
    profile_id: uuid.UUID
    environment_id: uuid.UUID
    # None: the runtime worker chooses (the device selection rule).
    device_id: DeviceId | None = None
    max_attempts: Attempts = 3


class DeviceJobCreate(WireModel):
    """POST …/runtime/probes with kind runtime.health.v1 (layered health of the device's
    server, with a one-token inference) or runtime.unload.v1 (stop it, report the time
    the device took to show its memory freed)."""

    kind: DeviceKind
    node_id: uuid.UUID
    device_id: DeviceId
    max_attempts: Attempts = 3


def _kind_of(value: Any) -> str | None:
    """The form a create body takes, by its `kind`; None (a 422) for what is no object."""
    if isinstance(value, dict):
        kind = value.get("kind", JobKind.RUNTIME_PROBE)
    elif isinstance(value, ProbeCreate | DeviceJobCreate):
        kind = value.kind
    else:
        return None
    return JobKind.RUNTIME_PROBE.value if kind == JobKind.RUNTIME_PROBE else "device"


RuntimeJobCreate = Annotated[
    Annotated[ProbeCreate, Tag(JobKind.RUNTIME_PROBE.value)]
    | Annotated[DeviceJobCreate, Tag("device")],
    Discriminator(_kind_of),
]


class VerifiedFile(WireModel):
    """A file on the node, resolved from an artifact reference: its absolute path in the
    node's artifact root and the digest the node checks before using it."""

    path: NodePath
    sha256: Sha256Hex


class ResolvedLora(VerifiedFile):
    scale: LoraScale = 1.0


# As many as a profile may name (ProfileCreate: loras).
ResolvedLoras = Annotated[list[ResolvedLora], Field(max_length=8)]


class ProbeSpec(WireModel):
    """What a runtime.probe.v1 lease carries: exact values only. The runtime worker
    checks `settings` against the allow-list again before it builds argv (the node does
    not trust that the control plane did), and refuses the lease otherwise."""

    artifact_path: NodePath
    artifact_digest: Sha256Hex
    profile_id: uuid.UUID
    profile_version: Positive
    settings: StoredSettings
    # The profile's draft model and LoRAs, resolved on this node.
    draft_model: VerifiedFile | None = None
    loras: ResolvedLoras = Field(default_factory=list)
    environment_id: uuid.UUID
    binary_sha256: Sha256Hex
    device_id: DeviceId | None = None
    prompt: Annotated[Text, Field(max_length=500)] = PROBE_PROMPT
    max_tokens: Annotated[int, Strict(), Field(ge=1, le=64), BeforeValidator(json_integer)] = (
        PROBE_MAX_TOKENS
    )


class DeviceSpec(WireModel):
    """What a runtime.health.v1 or runtime.unload.v1 lease carries: the device."""

    device_id: DeviceId


class ProbeClaim(WireModel):
    job_id: uuid.UUID
    kind: Literal[JobKind.RUNTIME_PROBE] = JobKind.RUNTIME_PROBE
    attempt: Attempts
    spec: ProbeSpec
    lease: Lease


class DeviceJobClaim(WireModel):
    job_id: uuid.UUID
    kind: DeviceKind
    attempt: Attempts
    spec: DeviceSpec
    lease: Lease


# GET …/runtime-probes/next answers one of these, by `kind`.
RuntimeClaim = Annotated[ProbeClaim | DeviceJobClaim, Field(discriminator="kind")]


# Where a runtime job is: verifying its files, loading the model, probing it.
Phase = Literal["verifying", "loading", "probing", "draining", "unloading"]


class RuntimeJobProgress(WireModel):
    lease: LeaseFence
    phase: Phase


class ServerHealth(WireModel):
    """Layered: each layer only if the one before it held."""

    process_up: Flag
    health_ok: Flag
    model_listed: Flag
    inference_ok: Flag


Seconds = Annotated[Number, Field(ge=0, le=86_400)]
Rate = Annotated[Number, Field(ge=0, le=1e9)]


class ProbeEvidence(WireModel):
    load_s: Seconds
    time_to_first_token_s: Seconds
    prompt_tokens_per_s: Rate | None = None
    generation_tokens_per_s: Rate | None = None
    peak_rss_bytes: Count | None = None
    # Where the device reports it (NVML).
    vram_used_bytes: Count | None = None
    # Seconds the device took to show memory freed after the server it replaced.
    settle_s: Seconds | None = None


class ProbeComplete(WireModel):
    kind: Literal[JobKind.RUNTIME_PROBE] = JobKind.RUNTIME_PROBE
    lease: LeaseFence
    device_id: DeviceId
    health: ServerHealth
    evidence: ProbeEvidence


class HealthComplete(WireModel):
    kind: Literal[JobKind.RUNTIME_HEALTH]
    lease: LeaseFence
    device_id: DeviceId
    health: ServerHealth
    loaded_model: Annotated[Text, Field(max_length=128)] | None = None


class UnloadComplete(WireModel):
    kind: Literal[JobKind.RUNTIME_UNLOAD]
    lease: LeaseFence
    device_id: DeviceId
    unloaded_model: Annotated[Text, Field(max_length=128)] | None = None
    # None: nothing was loaded, so nothing had to settle.
    settle_s: Seconds | None = None


def _completed_kind(value: Any) -> str | None:
    if isinstance(value, dict):
        return str(value.get("kind", JobKind.RUNTIME_PROBE.value))
    if isinstance(value, ProbeComplete | HealthComplete | UnloadComplete):
        return value.kind
    return None


# POST …/runtime-probes/{id}/complete: the body of the job's kind (a probe's by default).
RuntimeComplete = Annotated[
    Annotated[ProbeComplete, Tag(JobKind.RUNTIME_PROBE.value)]
    | Annotated[HealthComplete, Tag(JobKind.RUNTIME_HEALTH.value)]
    | Annotated[UnloadComplete, Tag(JobKind.RUNTIME_UNLOAD.value)],
    Discriminator(_completed_kind),
]


class ProbeResult(WireModel):
    """What a completed runtime.probe.v1 job measured (the latest per node, device,
    artifact, profile and environment is also its evidence, EvidenceView)."""

    device_id: str
    health: ServerHealth
    evidence: ProbeEvidence


class HealthResult(WireModel):
    """What a completed runtime.health.v1 job found on the device."""

    device_id: str
    health: ServerHealth
    loaded_model: str | None = None


class UnloadResult(WireModel):
    """What a completed runtime.unload.v1 job stopped, and how long the device took to
    show its memory freed (None: nothing was loaded)."""

    device_id: str
    unloaded_model: str | None = None
    settle_s: float | None = None


class RuntimeJobOutcome(WireModel):
    job_id: uuid.UUID
    state: JobState


class RuntimeJobFail(WireModel):
    lease: LeaseFence
    code: RuntimeFailure
    retryable: Flag
    detail: Note = ""
    # Layers that held before the failure, when known.
    health: ServerHealth | None = None


class EvidenceView(WireModel):
    """The latest evidence per (node, device, artifact, profile, environment)."""

    node_id: uuid.UUID
    device_id: str
    artifact_digest: str
    artifact_path: str
    profile_id: uuid.UUID
    environment_id: uuid.UUID
    health: ServerHealth
    evidence: ProbeEvidence
    job_id: uuid.UUID
    recorded_at: datetime


class EvidenceList(WireModel):
    items: list[EvidenceView]


class RuntimeProgressView(WireModel):
    phase: Phase
    reported_at: datetime


class ProbeJobView(JobView):
    kind: Literal[JobKind.RUNTIME_PROBE]
    spec: ProbeSpec
    progress: RuntimeProgressView | None
    result: ProbeResult | None


class HealthJobView(JobView):
    kind: Literal[JobKind.RUNTIME_HEALTH]
    spec: DeviceSpec
    progress: RuntimeProgressView | None
    result: HealthResult | None


class UnloadJobView(JobView):
    kind: Literal[JobKind.RUNTIME_UNLOAD]
    spec: DeviceSpec
    progress: RuntimeProgressView | None
    result: UnloadResult | None


# A runtime job of any kind, as an operator sees it: the shared JobView, by `kind`.
RuntimeKindView = ProbeJobView | HealthJobView | UnloadJobView
RuntimeJobView = Annotated[RuntimeKindView, Field(discriminator="kind")]


RUNTIME_FAMILY: Final = JobFamily(
    name="runtime",
    next=RUNTIME_JOBS_NEXT,
    progress_path=RUNTIME_JOB_PROGRESS,
    complete_path=RUNTIME_JOB_COMPLETE,
    fail_path=RUNTIME_JOB_FAIL,
    types=(
        JobType(
            kind=JobKind.RUNTIME_PROBE,
            spec=ProbeSpec,
            claim=ProbeClaim,
            completion=ProbeComplete,
            result=ProbeResult,
            view=ProbeJobView,
        ),
        JobType(
            kind=JobKind.RUNTIME_HEALTH,
            spec=DeviceSpec,
            claim=DeviceJobClaim,
            completion=HealthComplete,
            result=HealthResult,
            view=HealthJobView,
        ),
        JobType(
            kind=JobKind.RUNTIME_UNLOAD,
            spec=DeviceSpec,
            claim=DeviceJobClaim,
            completion=UnloadComplete,
            result=UnloadResult,
            view=UnloadJobView,
        ),
    ),
    claim=RuntimeClaim,
    progress=RuntimeJobProgress,
    progress_view=RuntimeProgressView,
    completion=RuntimeComplete,
    completed=RuntimeJobOutcome,
    fail=RuntimeJobFail,
    docs=RouteDocs(
        claim="The node's next runtime job of any kind (probe, health, unload), by `kind`.",
        progress="The phase; extends the lease. The answer says whether to stop (cancelled).",
        complete="""A probe's layered health and measured evidence (stored per node, device,
    artifact, profile and environment), or a health or unload job's report; the body
    must be of the job's kind.""",
        fail="A normalised runtime failure. Retried with backoff while it may help.",
    ),
)


class RuntimeJobList(WireModel):
    items: list[RuntimeJobView]


class RuntimeProfileList(WireModel):
    items: list[RuntimeProfileView]


class RuntimeEnvironmentList(WireModel):
    items: list[RuntimeEnvironmentView]
