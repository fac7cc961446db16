"""Administrative routes (under ADMIN_PREFIX, schemas/protocol.py). Every one requires the
operator key.

Each route is one call: to a store rule where the answer is the rule's own result
(tokens, credentials, decommission, the audit log: store/tokens.py,
store/node_credentials.py, store/decommission.py, store/audit.py), or to the admin
module that builds the view from the store's rows (api/admin/nodes.py, fleet.py, ...).
"""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Depends, Query, status

from api.admin import (
    artifact_jobs,
    dead_letters,
    deployments,
    events,
    fleet,
    nodes,
    overview,
    runtime,
    service_clients,
    services,
    usage,
)
from api.deps import AdminTransaction, State, require_operator
from api.errors import error_responses
from schemas.admin import (
    AcknowledgeIncident,
    AuditList,
    AuditQuery,
    CreateEnrollmentToken,
    CredentialRevoked,
    CredentialRotated,
    DeadLetterInfo,
    DeadLetterList,
    DeadLetterReplayed,
    DecommissionPreview,
    DecommissionRequest,
    DecommissionResult,
    EnrollmentTokenCreated,
    EnrollmentTokenInfo,
    EnrollmentTokenList,
    FleetIncidentInfo,
    FleetIncidentList,
    FleetSafety,
    LabelFilter,
    Liveness,
    NodeDetail,
    NodeList,
    NodePatch,
    PageLimit,
    TokenState,
)
from schemas.base import CountParam, FilterText, PositiveParam
from schemas.protocol import AUDIT, DEAD_LETTERS, FLEET, NODES, TOKENS
from store import audit, decommission, node_credentials, tokens

# Every admin route: no or a wrong operator key (401/403), a body too large (413) or
# malformed (422), the database (or, for dead letters, NATS) unavailable (503). The
# OpenAPI document adds 404 and 409 only where a route can answer them.
_ERRORS = error_responses(401, 403, 413, 422, 503)
MISSING = error_responses(404)
MISSING_OR_CONFLICT = error_responses(404, 409)

# The router-level dependency makes fail-closed structural: a route added here
# later cannot forget the operator check.
router = APIRouter(
    tags=["admin"],
    dependencies=[Depends(require_operator)],
    responses=_ERRORS,
)


@router.post(TOKENS, status_code=status.HTTP_201_CREATED, responses=MISSING_OR_CONFLICT)
async def create_token(
    body: CreateEnrollmentToken, session: AdminTransaction
) -> EnrollmentTokenCreated:
    return await tokens.create(session, body)


@router.get(TOKENS)
async def list_tokens(
    session: AdminTransaction,
    state: TokenState | None = None,
    limit: PageLimit = 100,
) -> EnrollmentTokenList:
    return EnrollmentTokenList(items=await tokens.listed(session, state, limit))


@router.post(TOKENS + "/{token_id}/revoke", responses=MISSING_OR_CONFLICT)
async def revoke_token(token_id: uuid.UUID, session: AdminTransaction) -> EnrollmentTokenInfo:
    return await tokens.revoke(session, token_id)


@router.get(NODES)
async def list_nodes(
    session: AdminTransaction,
    state: State,
    liveness: Annotated[list[Liveness] | None, Query()] = None,
    label: Annotated[
        list[LabelFilter] | None, Query(max_length=64, description="key=value or key; repeatable")
    ] = None,
    limit: PageLimit = 100,
    offset: CountParam = 0,
) -> NodeList:
    items = await nodes.list_nodes(
        session,
        state.thresholds,
        liveness=liveness or [],
        labels=nodes.parse_label_filters(label or []),
        limit=limit,
        offset=offset,
    )
    return NodeList(items=items)


@router.get(NODES + "/{node_id}", responses=MISSING)
async def get_node(node_id: uuid.UUID, session: AdminTransaction, state: State) -> NodeDetail:
    return await nodes.get_node(session, state.thresholds, node_id)


@router.patch(NODES + "/{node_id}", responses=MISSING_OR_CONFLICT)
async def patch_node(
    node_id: uuid.UUID, body: NodePatch, session: AdminTransaction, state: State
) -> NodeDetail:
    return await nodes.patch_node(session, state.thresholds, node_id, body)


@router.post(NODES + "/{node_id}/credential/revoke", responses=MISSING_OR_CONFLICT)
async def revoke_credential(node_id: uuid.UUID, session: AdminTransaction) -> CredentialRevoked:
    return await node_credentials.revoke(session, node_id)


@router.post(NODES + "/{node_id}/credential/rotate", responses=MISSING_OR_CONFLICT)
async def rotate_credential(node_id: uuid.UUID, session: AdminTransaction) -> CredentialRotated:
    return await node_credentials.rotate(session, node_id)


@router.get(NODES + "/{node_id}/decommission/preview", responses=MISSING)
async def preview_decommission(
    node_id: uuid.UUID, session: AdminTransaction, state: State
) -> DecommissionPreview:
    return await decommission.preview(session, state.thresholds, node_id)


@router.post(NODES + "/{node_id}/decommission", responses=MISSING_OR_CONFLICT)
async def decommission_node(
    node_id: uuid.UUID, body: DecommissionRequest, session: AdminTransaction
) -> DecommissionResult:
    return await decommission.execute(session, node_id, body)


@router.get(AUDIT)
async def query_audit(
    session: AdminTransaction, query: Annotated[AuditQuery, Query()]
) -> AuditList:
    return await audit.query(session, query)


@router.get(FLEET)
async def fleet_safety(session: AdminTransaction) -> FleetSafety:
    return await fleet.safety(session)


@router.get(FLEET + "/incidents")
async def list_fleet_incidents(
    session: AdminTransaction, limit: PageLimit = 100
) -> FleetIncidentList:
    return await fleet.list_incidents(session, limit)


@router.post(FLEET + "/incidents/{incident_id}/acknowledge", responses=MISSING_OR_CONFLICT)
async def acknowledge_fleet_incident(
    incident_id: uuid.UUID, body: AcknowledgeIncident, session: AdminTransaction
) -> FleetIncidentInfo:
    return await fleet.acknowledge(session, incident_id, body.reason)


@router.get(DEAD_LETTERS)
async def list_dead_letters(
    state: State,
    queue: FilterText | None = None,
    after_seq: CountParam = 0,
    limit: Annotated[PageLimit, Query(le=500)] = 50,
) -> DeadLetterList:
    return await dead_letters.list_dead_letters(
        state.broker, state.broker_names, queue=queue, after_seq=after_seq, limit=limit
    )


@router.get(DEAD_LETTERS + "/{seq}", responses=MISSING)
async def get_dead_letter(seq: PositiveParam, state: State) -> DeadLetterInfo:
    return await dead_letters.get_dead_letter(state.broker, state.broker_names, seq)


@router.post(DEAD_LETTERS + "/{seq}/replay", responses=MISSING_OR_CONFLICT)
async def replay_dead_letter(seq: PositiveParam, state: State) -> DeadLetterReplayed:
    return await dead_letters.replay(state.broker, state.broker_names, seq)


@router.delete(DEAD_LETTERS + "/{seq}", status_code=status.HTTP_204_NO_CONTENT, responses=MISSING)
async def delete_dead_letter(seq: PositiveParam, state: State) -> None:
    await dead_letters.delete(state.broker, state.broker_names, seq)


# Operator areas with a module of their own; included here, so the operator check above
# covers every one of their routes too.
router.include_router(artifact_jobs.router)
router.include_router(runtime.router)
router.include_router(deployments.router)
router.include_router(service_clients.router)
router.include_router(services.router)
router.include_router(events.router)
router.include_router(usage.router)
router.include_router(overview.router)
