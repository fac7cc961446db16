"""The runtime worker's local wire: its OpenAI-compatible endpoints' paths and what it
reports about its devices and models (the RoleMesh node agent's inventory and
registration, and the control plane's runtime report)."""

from __future__ import annotations

import uuid
from typing import Annotated, Final, Literal

from pydantic import Field

from schemas.agent import Sequence
from schemas.base import Count, Number, Text, Timestamp, WireModel
from schemas.deployments import ReportedDeployment
from schemas.runtime import DeviceId, EnvironmentReport

# The runtime worker's local endpoints (the local API, not the control plane's).
LOCAL_MODELS: Final = "/v1/models"
LOCAL_CHAT_COMPLETIONS: Final = "/v1/chat/completions"
LOCAL_COMPLETIONS: Final = "/v1/completions"
LOCAL_EMBEDDINGS: Final = "/v1/embeddings"
LOCAL_INVENTORY: Final = "/v1/node/inventory"
LOCAL_REGISTRATION: Final = "/v1/node/registration"
LOCAL_HEALTH: Final = "/healthz"
# RoleMesh's dispatcher, when `dispatcher_base_url` is set.
DISPATCHER_REGISTER: Final = "/v1/nodes/register"
DISPATCHER_HEARTBEAT: Final = "/v1/nodes/heartbeat"


ModelName = Annotated[Text, Field(min_length=1, max_length=128)]
Role = Annotated[Text, Field(min_length=1, max_length=64)]


class RuntimeDevice(WireModel):
    device_id: DeviceId
    backend: Literal["cpu", "cuda"]
    name: Annotated[Text, Field(max_length=200)] = ""
    uuid: Annotated[Text, Field(max_length=128)] | None = None
    memory_total_bytes: Count | None = None
    memory_free_bytes: Count | None = None
    utilization_percent: Annotated[Number, Field(ge=0, le=100)] | None = None
    loaded_model: ModelName | None = None
    # In flight plus queued.
    queue_depth: Count
    # Seconds the device took to show the last unloaded server's memory freed.
    last_settle_s: Annotated[Number, Field(ge=0)] | None = None


class ServedModel(WireModel):
    model_id: ModelName
    roles: Annotated[list[Role], Field(max_length=32)] = Field(default_factory=list)


class RuntimeInventory(WireModel):
    devices: Annotated[list[RuntimeDevice], Field(max_length=64)]
    served_models: Annotated[list[ServedModel], Field(max_length=256)]
    loaded_models: Annotated[list[ModelName], Field(max_length=64)]
    # The deployments loaded here (M5), with their invokes in flight.
    deployments: Annotated[list[ReportedDeployment], Field(max_length=64)] = Field(
        default_factory=list
    )


class RuntimeRegistration(WireModel):
    """What the node sends to a RoleMesh dispatcher (and shows at LOCAL_REGISTRATION)."""

    node_id: str
    base_url: str
    served_models: list[ServedModel]
    devices: list[RuntimeDevice]


class RuntimeReport(RuntimeInventory):
    """PUT the control plane's RUNTIME route: the runtime worker's own stream, ordered
    by its sequence like inventory (a replay or an older report is not applied)."""

    node_id: uuid.UUID
    sequence: Sequence
    observed_at: Timestamp
    environments: Annotated[list[EnvironmentReport], Field(max_length=16)]


class RuntimeReportAnswer(WireModel):
    applied: bool


class NodeRuntimeView(RuntimeInventory):
    """The admin view of a node's last applied runtime report."""

    environments: list[EnvironmentReport] = Field(default_factory=list)
    # False until the node's runtime worker has reported (then the lists are empty).
    reported: bool
