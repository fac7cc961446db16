"""Fleet safety for operators: the partition hold, its incidents, and acknowledging one."""

from __future__ import annotations

import uuid

from sqlalchemy.ext.asyncio import AsyncSession

from schemas.admin import ApiPresence, FleetIncidentInfo, FleetIncidentList, FleetSafety
from store import fleet
from store.models import FleetIncident


def _info(incident: FleetIncident) -> FleetIncidentInfo:
    return FleetIncidentInfo(
        id=incident.id,
        kind=incident.kind,
        opened_at=incident.opened_at,
        watched_nodes=incident.watched_nodes,
        silent_nodes=incident.silent_nodes,
        acknowledged_at=incident.acknowledged_at,
        acknowledged_reason=incident.acknowledged_reason,
        resolved_at=incident.resolved_at,
    )


async def safety(session: AsyncSession) -> FleetSafety:
    incident = await fleet.open_incident(session)
    row = await fleet.presence(session)
    presence = (
        ApiPresence(
            last_seen_at=row.last_seen_at, down_since=row.down_since, resumed_at=row.resumed_at
        )
        if row is not None
        else None
    )
    return FleetSafety(
        partition_hold=incident is not None and incident.acknowledged_at is None,
        open_incident=_info(incident) if incident is not None else None,
        api_presence=presence,
    )


async def list_incidents(session: AsyncSession, limit: int) -> FleetIncidentList:
    return FleetIncidentList(
        items=[_info(i) for i in await fleet.list_incidents(session, limit=limit)]
    )


async def acknowledge(
    session: AsyncSession, incident_id: uuid.UUID, reason: str
) -> FleetIncidentInfo:
    return _info(await fleet.acknowledge(session, incident_id, reason))
