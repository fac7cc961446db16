"""Rows to admin wire models."""

from __future__ import annotations

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
from store.models import Gpu, Node, NodeStream


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
    inventory = streams.get("inventory")
    telemetry = streams.get("telemetry")
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
