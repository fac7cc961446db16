"""Agent routes of protocol v1 (paths in schemas/protocol.py); bodies are wire models."""

from __future__ import annotations

from fastapi import APIRouter, status

from api.agent import jobs, notifications, runtime_channel
from api.agent.heartbeat import HeartbeatContext, handle_heartbeat
from api.deps import IngestTransaction, NodeTransaction, State, Transaction
from api.errors import error_responses
from api.metrics import counted_ingest
from schemas.agent import (
    EnrollRequest,
    EnrollResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    IngestResult,
    InventoryReport,
    TelemetryReport,
)
from schemas.protocol import ENROLL, HEARTBEAT, INVENTORY, RUNTIME, TELEMETRY, StreamName
from schemas.runtime_local import RuntimeReport
from store.enrollment import enroll
from store.ingest import ingest_inventory, ingest_runtime, ingest_telemetry

# Every agent route: a refused credential or token (401), a protocol version, replay or
# identity conflict (409), a body too large (413) or malformed (422), the database
# unavailable (503, with Retry-After). A node credential can also be refused for a
# disabled node or another node's object (403); enrollment has no node yet.
_ERRORS = error_responses(401, 409, 413, 422, 503)
NODE_ROUTE = error_responses(403)
# The fleet routes that shed load when the transactional path is overloaded (api/shedding.py).
SHEDDING_ROUTE = error_responses(403, 429)

router = APIRouter(tags=["agent"], responses=_ERRORS)


@router.post(ENROLL, status_code=status.HTTP_201_CREATED)
async def enroll_node(body: EnrollRequest, session: Transaction, state: State) -> EnrollResponse:
    return await enroll(session, body, heartbeat_interval_s=state.settings.heartbeat_interval_s)


@router.post(HEARTBEAT, responses=SHEDDING_ROUTE)
async def heartbeat(body: HeartbeatRequest, call: HeartbeatContext) -> HeartbeatResponse:
    return await handle_heartbeat(call, body)


@router.put(INVENTORY, responses=SHEDDING_ROUTE)
async def inventory(body: InventoryReport, request: IngestTransaction) -> IngestResult:
    with counted_ingest(request.state.metrics, StreamName.INVENTORY) as count:
        return count(
            await ingest_inventory(
                request.session,
                request.node,
                body,
                future_skew_limit_s=request.state.settings.future_skew_limit_s,
            )
        )


@router.put(TELEMETRY, responses=SHEDDING_ROUTE)
async def telemetry(body: TelemetryReport, request: IngestTransaction) -> IngestResult:
    with counted_ingest(request.state.metrics, StreamName.TELEMETRY) as count:
        return count(
            await ingest_telemetry(
                request.session,
                request.node,
                body,
                future_skew_limit_s=request.state.settings.future_skew_limit_s,
            )
        )


@router.put(RUNTIME, responses=NODE_ROUTE)
async def runtime_report(body: RuntimeReport, request: NodeTransaction) -> IngestResult:
    """Devices, loaded and served models, queue depths and the binaries it has."""
    return await ingest_runtime(
        request.session,
        request.node,
        body,
        future_skew_limit_s=request.state.settings.future_skew_limit_s,
    )


router.include_router(jobs.router)
router.include_router(notifications.router)
router.include_router(runtime_channel.router)
