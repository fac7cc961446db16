"""Node Agent Protocol v1: the agent's requests and the server's answers."""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from typing import Annotated

from pydantic import Field, model_validator

from schemas.base import AwareDatetime, WireModel

PROTOCOL_VERSION = 1

Capability = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_.]*$")]
Capabilities = Annotated[list[Capability], Field(max_length=64)]
ShortText = Annotated[str, Field(min_length=1, max_length=255)]
# Limits match the database columns, so anything that validates can be stored.
VersionText = Annotated[str, Field(min_length=1, max_length=100)]
Sequence = Annotated[int, Field(ge=1, le=2**63 - 1)]
NonNegInt = Annotated[int, Field(ge=0, le=2**63 - 1)]
Percent = Annotated[float, Field(ge=0, le=100)]


class EnrollRequest(WireModel):
    enrollment_token: Annotated[str, Field(min_length=1, max_length=512)]
    protocol_version: int
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
    protocol_version: int
    agent_version: VersionText
    capabilities: Capabilities = Field(default_factory=list)
    # Agent clock, informational only: liveness uses server-received time.
    observed_at: AwareDatetime | None = None


class HeartbeatResponse(WireModel):
    node_id: uuid.UUID
    received_at: datetime
    heartbeat_interval_s: float
    server_time: datetime


class HostFacts(WireModel):
    hostname: ShortText
    os: Annotated[str, Field(max_length=255)] = ""
    kernel: Annotated[str, Field(max_length=255)] = ""
    cpu_model: Annotated[str, Field(max_length=255)] = ""
    cpu_count: Annotated[int, Field(ge=0, le=65536)] = 0
    ram_total_bytes: NonNegInt = 0
    storage_total_bytes: NonNegInt = 0


class GpuInventory(WireModel):
    uuid: Annotated[str, Field(min_length=1, max_length=128)]
    index: Annotated[int, Field(ge=0, le=1024)]
    name: Annotated[str, Field(min_length=1, max_length=200)]
    pci_bus_id: Annotated[str, Field(min_length=1, max_length=64)]
    memory_total_bytes: NonNegInt
    driver_version: Annotated[str, Field(max_length=64)] | None = None
    cuda_version: Annotated[str, Field(max_length=64)] | None = None


class InventoryReport(WireModel):
    node_id: uuid.UUID
    sequence: Sequence
    observed_at: AwareDatetime
    # False when the GPU collector (NVML) failed: absent GPUs are then unknown, not missing.
    complete: bool
    host: HostFacts
    gpus: Annotated[list[GpuInventory], Field(max_length=256)] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_gpus(self) -> InventoryReport:
        uuids = [gpu.uuid for gpu in self.gpus]
        if len(set(uuids)) != len(uuids):
            raise ValueError("each GPU UUID may appear once")
        return self


class GpuTelemetry(WireModel):
    uuid: Annotated[str, Field(min_length=1, max_length=128)]
    utilization_percent: Percent | None = None
    memory_used_bytes: NonNegInt | None = None
    temperature_c: Annotated[float, Field(ge=-100, le=250)] | None = None
    power_w: Annotated[float, Field(ge=0, le=10_000)] | None = None


class StorageTelemetry(WireModel):
    path: Annotated[str, Field(min_length=1, max_length=1024)]
    total_bytes: NonNegInt
    used_bytes: NonNegInt


class TelemetryReport(WireModel):
    node_id: uuid.UUID
    sequence: Sequence
    observed_at: AwareDatetime
    ram_total_bytes: NonNegInt
    ram_used_bytes: NonNegInt
    storage: Annotated[list[StorageTelemetry], Field(max_length=64)] = Field(default_factory=list)
    gpus: Annotated[list[GpuTelemetry], Field(max_length=256)] = Field(default_factory=list)


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
