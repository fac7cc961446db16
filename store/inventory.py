"""Inventory: the route stores an accepted report; a worker reconciles it.

The inventory route decides ordering synchronously (store/ingest.py) and, for an
accepted report, calls `accept`: the report is stored as a pending observation with
its node.inventory.accepted event, in the request's transaction.

`reconcile` (run by workers/reconcile.py for each such event) applies every pending
observation of the node in sequence order under the node's lock, then deletes them.
It reads what to do from the database, never from the message, so any number of
replicas, any redelivery and any delivery order converge on the latest accepted
report and produce each GPU event once: the second delivery finds nothing pending.

GPUs are matched by (node_id, GPU UUID); index, PCI address, name, memory and versions
are mutable facts. A GPU is missing only after a *complete* inventory omits it.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from schemas.agent import GpuInventory, InventoryReport
from schemas.events import EventType, GpuEvent, InventoryAccepted, NodeUpdated, node_actor
from store import changes, nodes
from store.correlation import current_correlation_id
from store.models import Gpu, InventoryObservation, Node

_MUTABLE_FACTS = (
    "index",
    "name",
    "pci_bus_id",
    "memory_total_bytes",
    "driver_version",
    "cuda_version",
)


def accept(
    session: AsyncSession, node_id: uuid.UUID, report: InventoryReport, received_at: datetime
) -> None:
    """Store an accepted report for reconciliation, with its event."""
    session.add(
        InventoryObservation(
            node_id=node_id,
            sequence=report.sequence,
            received_at=received_at,
            correlation_id=current_correlation_id(),
            report=report.model_dump(mode="json"),
        )
    )
    changes.record(
        session,
        EventType.NODE_INVENTORY_ACCEPTED,
        InventoryAccepted(
            node_id=node_id,
            sequence=report.sequence,
            observed_at=report.observed_at,
            received_at=received_at,
            complete=report.complete,
            gpu_count=len(report.gpus),
        ),
        actor=node_actor(node_id),
    )


async def reconcile(session: AsyncSession, node_id: uuid.UUID) -> int:
    """Apply the node's pending observations, oldest first; how many were applied.

    Holds the node's lock for the transaction, so two reconcilers of one node never
    interleave, and agent requests of the node wait for the few statements this takes.
    """
    node = await nodes.lock(session, node_id)
    pending = list(
        (
            await session.execute(
                select(InventoryObservation)
                .where(InventoryObservation.node_id == node_id)
                .order_by(InventoryObservation.sequence)
            )
        ).scalars()
    )
    if not pending:
        return 0
    await session.execute(
        delete(InventoryObservation).where(
            InventoryObservation.node_id == node_id,
            InventoryObservation.sequence <= pending[-1].sequence,
        )
    )
    if node is None or nodes.is_terminal(node):
        # A decommissioned node never changes again, whatever it reported before.
        return 0
    for observation in pending:
        report = InventoryReport.model_validate(observation.report)
        await _apply(session, node, report, observation)
    return len(pending)


class _Applier:
    """One observation's diff: the events it emits carry the node as actor (the change is
    the node's report) and the report's correlation id."""

    def __init__(
        self, session: AsyncSession, node: Node, observation: InventoryObservation
    ) -> None:
        self.session = session
        self.node = node
        self.actor = node_actor(node.id)
        self.correlation_id = observation.correlation_id
        self.at = observation.received_at

    def gpu_event(
        self, kind: EventType, gpu: Gpu, diff: dict[str, list[Any]] | None = None
    ) -> None:
        changes.record(
            self.session,
            kind,
            GpuEvent(
                node_id=self.node.id,
                gpu_uuid=gpu.uuid,
                index=gpu.index,
                name=gpu.name,
                pci_bus_id=gpu.pci_bus_id,
                changes=diff or {},
            ),
            actor=self.actor,
            target=changes.Target("gpu", f"{self.node.id}/{gpu.uuid}"),
            correlation_id=self.correlation_id,
        )

    def hostname(self, hostname: str) -> None:
        if self.node.hostname == hostname:
            return
        diff = {"hostname": [self.node.hostname, hostname]}
        self.node.hostname = hostname
        self.node.updated_at = self.at
        changes.record(
            self.session,
            EventType.NODE_UPDATED,
            NodeUpdated(node_id=self.node.id, changes=diff),
            actor=self.actor,
            correlation_id=self.correlation_id,
        )


def _diff(row: Gpu, reported: GpuInventory) -> dict[str, list[Any]]:
    return {
        field: [getattr(row, field), getattr(reported, field)]
        for field in _MUTABLE_FACTS
        if getattr(row, field) != getattr(reported, field)
    }


async def _apply(
    session: AsyncSession, node: Node, report: InventoryReport, observation: InventoryObservation
) -> None:
    apply = _Applier(session, node, observation)
    apply.hostname(report.host.hostname)
    known = {
        gpu.uuid: gpu
        for gpu in (await session.execute(select(Gpu).where(Gpu.node_id == node.id))).scalars()
    }
    for reported in report.gpus:
        row = known.get(reported.uuid)
        if row is None:
            row = Gpu(
                node_id=node.id,
                uuid=reported.uuid,
                first_seen_at=apply.at,
                last_seen_at=apply.at,
                **reported.model_dump(include=set(_MUTABLE_FACTS)),
            )
            session.add(row)
            known[row.uuid] = row
            apply.gpu_event(EventType.GPU_ADDED, row)
            continue
        row.last_seen_at = apply.at
        if row.missing_since is not None:
            row.missing_since = None
            apply.gpu_event(EventType.GPU_RETURNED, row)
        diff = _diff(row, reported)
        if diff:
            for field, (_, new) in diff.items():
                setattr(row, field, new)
            apply.gpu_event(EventType.GPU_CHANGED, row, diff)
    if not report.complete:
        # NVML failed or was unavailable: an absent GPU is unknown, not missing.
        return
    reported_uuids = {gpu.uuid for gpu in report.gpus}
    for uuid_, row in known.items():
        if uuid_ not in reported_uuids and row.missing_since is None:
            row.missing_since = apply.at
            apply.gpu_event(EventType.GPU_MISSING, row)
