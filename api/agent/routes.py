"""Agent routes of protocol v1 (`/api/v1/agent`). Bodies are wire models from schemas/."""

from __future__ import annotations

from fastapi import APIRouter, status

from api.agent.enrollment import enroll
from api.agent.heartbeat import record_heartbeat
from api.agent.ingest import ingest_inventory, ingest_telemetry
from api.deps import HeartbeatTransaction, NodeTransaction, State, Transaction
from api.errors import error_responses
from schemas.agent import (
    EnrollRequest,
    EnrollResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    IngestResult,
    InventoryReport,
    TelemetryReport,
)

# Every agent route: a refused credential or token (401), a protocol version, replay or
# identity conflict (409), a body too large (413) or malformed (422), the database
# unavailable (503, with Retry-After). A node credential can also be refused for a
# disabled node or another node's object (403); enrollment has no node yet.
_ERRORS = error_responses(401, 409, 413, 422, 503)
NODE_ROUTE = error_responses(403)

router = APIRouter(prefix="/api/v1/agent", tags=["agent"], responses=_ERRORS)


@router.post("/enroll", status_code=status.HTTP_201_CREATED)
async def enroll_node(body: EnrollRequest, session: Transaction, state: State) -> EnrollResponse:
    return await enroll(session, body, heartbeat_interval_s=state.settings.heartbeat_interval_s)


@router.post("/heartbeat", responses=NODE_ROUTE)
async def heartbeat(body: HeartbeatRequest, request: HeartbeatTransaction) -> HeartbeatResponse:
    return await record_heartbeat(
        request.session,
        request.node,
        body,
        heartbeat_interval_s=request.state.settings.heartbeat_interval_s,
    )


@router.put("/inventory", responses=NODE_ROUTE)
async def inventory(body: InventoryReport, request: NodeTransaction) -> IngestResult:
    return await ingest_inventory(
        request.session,
        request.node,
        body,
        future_skew_limit_s=request.state.settings.future_skew_limit_s,
    )


@router.put("/telemetry", responses=NODE_ROUTE)
async def telemetry(body: TelemetryReport, request: NodeTransaction) -> IngestResult:
    return await ingest_telemetry(
        request.session,
        request.node,
        body,
        future_skew_limit_s=request.state.settings.future_skew_limit_s,
    )
