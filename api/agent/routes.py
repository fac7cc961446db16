"""Agent routes of protocol v1 (`/api/v1/agent`). Bodies are wire models from schemas/."""

from __future__ import annotations

from fastapi import APIRouter, status

from api.agent.enrollment import enroll
from api.agent.heartbeat import record_heartbeat
from api.agent.ingest import ingest_inventory, ingest_telemetry
from api.deps import HeartbeatTransaction, NodeTransaction, State, Transaction
from schemas.agent import (
    EnrollRequest,
    EnrollResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    IngestResult,
    InventoryReport,
    TelemetryReport,
)
from schemas.errors import ErrorBody

_ERRORS: dict[int | str, dict[str, object]] = {
    # 503: the database is unavailable (Retry-After).
    code: {"model": ErrorBody}
    for code in (401, 403, 409, 413, 422, 503)
}

router = APIRouter(prefix="/api/v1/agent", tags=["agent"], responses=_ERRORS)


@router.post("/enroll", status_code=status.HTTP_201_CREATED)
async def enroll_node(body: EnrollRequest, session: Transaction, state: State) -> EnrollResponse:
    return await enroll(session, body, heartbeat_interval_s=state.settings.heartbeat_interval_s)


@router.post("/heartbeat")
async def heartbeat(body: HeartbeatRequest, request: HeartbeatTransaction) -> HeartbeatResponse:
    return await record_heartbeat(
        request.session,
        request.node,
        body,
        heartbeat_interval_s=request.state.settings.heartbeat_interval_s,
    )


@router.put("/inventory")
async def inventory(body: InventoryReport, request: NodeTransaction) -> IngestResult:
    return await ingest_inventory(
        request.session,
        request.node,
        body,
        future_skew_limit_s=request.state.settings.future_skew_limit_s,
    )


@router.put("/telemetry")
async def telemetry(body: TelemetryReport, request: NodeTransaction) -> IngestResult:
    return await ingest_telemetry(
        request.session,
        request.node,
        body,
        future_skew_limit_s=request.state.settings.future_skew_limit_s,
    )
