"""GPU reconciliation by (node_id, GPU UUID); index, PCI address and hostname are mutable facts."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from api.agent.auth import AuthenticatedNode
from schemas.agent import GpuInventory, InventoryReport
from schemas.events import EventType, GpuEvent, NodeUpdated
from store import audit, outbox
from store.models import Gpu, Node

_MUTABLE_FACTS = (
    "index",
    "name",
    "pci_bus_id",
    "memory_total_bytes",
    "driver_version",
    "cuda_version",
)


def _event(node_id: Any, gpu: Gpu, changes: dict[str, list[Any]] | None = None) -> GpuEvent:
    return GpuEvent(
        node_id=node_id,
        gpu_uuid=gpu.uuid,
        index=gpu.index,
        name=gpu.name,
        pci_bus_id=gpu.pci_bus_id,
        changes=changes or {},
    )


def _publish(
    session: AsyncSession, node: AuthenticatedNode, kind: EventType, event: GpuEvent
) -> None:
    audit.record(
        session,
        actor=audit.node_actor(node.node_id),
        action=kind.value,
        target_type="gpu",
        target_id=f"{node.node_id}/{event.gpu_uuid}",
        details=event.model_dump(mode="json", exclude={"node_id"}),
    )
    outbox.emit(session, kind, target_id=node.node_id, node_id=node.node_id, payload=event)


def _changes(row: Gpu, reported: GpuInventory) -> dict[str, list[Any]]:
    return {
        field: [getattr(row, field), getattr(reported, field)]
        for field in _MUTABLE_FACTS
        if getattr(row, field) != getattr(reported, field)
    }


async def _update_hostname(session: AsyncSession, node: AuthenticatedNode, hostname: str) -> None:
    row = await session.get(Node, node.node_id)
    assert row is not None
    if row.hostname == hostname:
        return
    change = {"hostname": [row.hostname, hostname]}
    row.hostname = hostname
    row.updated_at = node.received_at
    audit.record(
        session,
        actor=audit.node_actor(node.node_id),
        action="node.updated",
        target_type="node",
        target_id=node.node_id,
        details={"changes": change},
    )
    outbox.emit(
        session,
        EventType.NODE_UPDATED,
        target_id=node.node_id,
        node_id=node.node_id,
        payload=NodeUpdated(node_id=node.node_id, changes=change),
    )


async def reconcile_gpus(
    session: AsyncSession, node: AuthenticatedNode, report: InventoryReport
) -> None:
    await _update_hostname(session, node, report.host.hostname)
    known = {
        gpu.uuid: gpu
        for gpu in (await session.execute(select(Gpu).where(Gpu.node_id == node.node_id))).scalars()
    }
    now = node.received_at
    for reported in report.gpus:
        row = known.get(reported.uuid)
        if row is None:
            row = Gpu(
                node_id=node.node_id,
                uuid=reported.uuid,
                first_seen_at=now,
                last_seen_at=now,
                **reported.model_dump(include=set(_MUTABLE_FACTS)),
            )
            session.add(row)
            _publish(session, node, EventType.GPU_ADDED, _event(node.node_id, row))
            continue
        row.last_seen_at = now
        if row.missing_since is not None:
            row.missing_since = None
            _publish(session, node, EventType.GPU_RETURNED, _event(node.node_id, row))
        changes = _changes(row, reported)
        if changes:
            for field, (_, new) in changes.items():
                setattr(row, field, new)
            _publish(session, node, EventType.GPU_CHANGED, _event(node.node_id, row, changes))
    if not report.complete:
        # NVML failed or was unavailable: an absent GPU is unknown, not missing.
        return
    reported_uuids = {gpu.uuid for gpu in report.gpus}
    for uuid, row in known.items():
        if uuid not in reported_uuids and row.missing_since is None:
            row.missing_since = now
            _publish(session, node, EventType.GPU_MISSING, _event(node.node_id, row))
