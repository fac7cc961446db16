"""Node Agent Protocol v1: the agent's requests and the server's answers."""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Final

from pydantic import BeforeValidator, Field, Strict, field_validator

from schemas.base import (
    SAFE_INT_MAX,
    Count,
    Flag,
    Integer,
    Number,
    RootPath,
    ShortText,
    Text,
    Timestamp,
    WireModel,
    json_integer,
)

PROTOCOL_VERSION = 1

# Sequences run from 1 to 2**53 - 1: every JSON parser reads that exactly, and at one
# sample a millisecond a stream lasts 285,000 years. A stream that reached the ceiling
# would refuse every later sample as a replay, so nothing above it is accepted at all.
SEQUENCE_MAX: Final = SAFE_INT_MAX

Capability = Annotated[
    str, Strict(), Field(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_.]*$")
]
Capabilities = Annotated[list[Capability], Field(max_length=64)]
# Limits match the database columns, so anything that validates can be stored.
VersionText = Annotated[Text, Field(min_length=1, max_length=100)]
Sequence = Annotated[int, Strict(), Field(ge=1, le=SEQUENCE_MAX), BeforeValidator(json_integer)]
CpuCount = Annotated[int, Strict(), Field(ge=0, le=65536), BeforeValidator(json_integer)]
GpuIndex = Annotated[int, Strict(), Field(ge=0, le=1024), BeforeValidator(json_integer)]
Percent = Annotated[Number, Field(ge=0, le=100)]
GpuUuid = Annotated[Text, Field(min_length=1, max_length=128)]


def _unique(values: list[str], what: str, *, fold_case: bool = False) -> None:
    # GPU UUIDs compare case-insensitively: they are hex, "GPU-AB" and "gpu-ab" are one device.
    keys = [value.casefold() for value in values] if fold_case else values
    if len(set(keys)) != len(keys):
        raise ValueError(f"each {what} may appear once")


class EnrollRequest(WireModel):
    enrollment_token: Annotated[Text, Field(min_length=1, max_length=512)]
    protocol_version: Integer
    agent_version: VersionText
    hostname: ShortText
    capabilities: Capabilities = Field(default_factory=list)
    # Set only when re-binding a persisted identity with a recovery token.
    node_id: uuid.UUID | None = None


class EnrollResponse(WireModel):
    node_id: uuid.UUID
    credential_id: uuid.UUID
    # Shown exactly once; the server keeps only its digest.
    credential: str
    heartbeat_interval_s: float
    server_time: datetime
    protocol_version: int


class HeartbeatRequest(WireModel):
    node_id: uuid.UUID
    protocol_version: Integer
    agent_version: VersionText
    capabilities: Capabilities = Field(default_factory=list)
    # Agent clock, informational only: liveness uses server-received time.
    observed_at: Timestamp | None = None


class HeartbeatResponse(WireModel):
    node_id: uuid.UUID
    received_at: datetime
    heartbeat_interval_s: float
    server_time: datetime


class HostFacts(WireModel):
    hostname: ShortText
    os: Annotated[Text, Field(max_length=255)] = ""
    kernel: Annotated[Text, Field(max_length=255)] = ""
    cpu_model: Annotated[Text, Field(max_length=255)] = ""
    cpu_count: CpuCount = 0
    ram_total_bytes: Count = 0
    storage_total_bytes: Count = 0
    # Directories the agent's config allows artifact jobs to write into: a job's target
    # root must be one of these (schemas/artifacts.py).
    artifact_roots: Annotated[
        list[RootPath],
        Field(max_length=16),
    ] = Field(default_factory=list)


class GpuInventory(WireModel):
    uuid: GpuUuid
    index: GpuIndex
    name: Annotated[Text, Field(min_length=1, max_length=200)]
    pci_bus_id: Annotated[Text, Field(min_length=1, max_length=64)]
    memory_total_bytes: Count
    driver_version: Annotated[Text, Field(max_length=64)] | None = None
    cuda_version: Annotated[Text, Field(max_length=64)] | None = None


class InventoryReport(WireModel):
    node_id: uuid.UUID
    sequence: Sequence
    observed_at: Timestamp
    # False when the GPU collector (NVML) failed: absent GPUs are then unknown, not missing.
    complete: Flag
    host: HostFacts
    gpus: Annotated[
        list[GpuInventory],
        Field(max_length=256, description="UUIDs (case-insensitively) and indexes are unique"),
    ] = Field(default_factory=list)

    @field_validator("gpus")
    @classmethod
    def _unique_gpus(cls, gpus: list[GpuInventory]) -> list[GpuInventory]:
        _unique([gpu.uuid for gpu in gpus], "GPU UUID", fold_case=True)
        _unique([str(gpu.index) for gpu in gpus], "GPU index")
        return gpus


class GpuTelemetry(WireModel):
    uuid: GpuUuid
    utilization_percent: Percent | None = None
    memory_used_bytes: Count | None = None
    temperature_c: Annotated[Number, Field(ge=-100, le=250)] | None = None
    power_w: Annotated[Number, Field(ge=0, le=10_000)] | None = None


class StorageTelemetry(WireModel):
    path: Annotated[Text, Field(min_length=1, max_length=1024)]
    total_bytes: Count
    used_bytes: Count


class TelemetryReport(WireModel):
    node_id: uuid.UUID
    sequence: Sequence
    observed_at: Timestamp
    ram_total_bytes: Count
    ram_used_bytes: Count
    storage: Annotated[
        list[StorageTelemetry], Field(max_length=64, description="paths are unique")
    ] = Field(default_factory=list)
    gpus: Annotated[
        list[GpuTelemetry],
        Field(max_length=256, description="UUIDs are unique (case-insensitively)"),
    ] = Field(default_factory=list)

    @field_validator("gpus")
    @classmethod
    def _unique_gpus(cls, gpus: list[GpuTelemetry]) -> list[GpuTelemetry]:
        _unique([gpu.uuid for gpu in gpus], "GPU UUID", fold_case=True)
        return gpus

    @field_validator("storage")
    @classmethod
    def _unique_paths(cls, storage: list[StorageTelemetry]) -> list[StorageTelemetry]:
        _unique([item.path for item in storage], "storage path")
        return storage


class NotAppliedReason(StrEnum):
    OBSERVED_BEFORE_LAST_GOOD = "observed_before_last_good"
    OBSERVED_IN_FUTURE = "observed_in_future"


class IngestResult(WireModel):
    """Answer to an inventory or telemetry sample that passed the replay check."""

    node_id: uuid.UUID
    stream: str
    sequence: int
    # False: the cursor advanced but last-good state was kept (see reason).
    applied: bool
    reason: NotAppliedReason | None = None
    received_at: datetime
