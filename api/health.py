"""Process health (`/healthz`), readiness of the whole pipeline (`/readyz`), and the
Prometheus metrics (`/metrics`, api/metrics.py; under `--processes N`, those of every
API process on the port, summed).

`/healthz` says only that the process serves HTTP. `/readyz` says whether a change
accepted now reaches its consumers: the database answers, NATS answers, and the outbox
relay keeps up (a backlog or an oldest unsent event beyond the thresholds means events
are stalling, e.g. no worker runs), and, under `modelforge up`, no child of its
supervisor is failing (a worker or nats-server in a crash loop, retried while the API
keeps serving). Each check is bounded in time, so a hung dependency makes the answer
"not ready", never a hung probe.
"""

from __future__ import annotations

import asyncio
import logging

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy.exc import SQLAlchemyError

from api.deps import State
from api.state import ApiState
from schemas.health import CheckState, FailingChild, OutboxState, Readiness
from schemas.protocol import HEALTHZ, METRICS, READYZ
from schemas.stack import read_supervisor_state
from store import published
from store.fleet import partition_hold_active

logger = logging.getLogger("modelforge.api.health")

router = APIRouter(tags=["health"])

CHECK_TIMEOUT_S = 2.0


@router.get(METRICS, include_in_schema=False)
async def metrics(state: State) -> Response:
    """Prometheus text format; not part of the API contract (no OpenAPI entry)."""
    return Response(generate_latest(state.metrics.served), media_type=CONTENT_TYPE_LATEST)


@router.get(HEALTHZ)
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


async def _database(state: ApiState) -> tuple[OutboxState, bool]:
    settings = state.settings
    async with state.sessions() as session:
        unsent = await published.unsent(session, cap=settings.ready_outbox_backlog_max + 1)
        hold = await partition_hold_active(session)
    backlog, oldest = unsent.count, unsent.oldest_s
    lagging = backlog > settings.ready_outbox_backlog_max or (
        oldest is not None and oldest > settings.ready_outbox_lag_max_s
    )
    outbox = OutboxState(
        state=CheckState.LAGGING if lagging else CheckState.OK,
        backlog=backlog,
        oldest_unsent_s=oldest,
    )
    return outbox, hold


async def _failing(state: ApiState) -> list[FailingChild]:
    """What `up`'s supervisor reports failing (a small local file, read off the loop)."""
    path = state.settings.supervisor_state_file
    if path is None:
        return []
    supervisor = await asyncio.to_thread(read_supervisor_state, path)
    return supervisor.failing if supervisor is not None else []


@router.get(READYZ, response_model=Readiness, responses={503: {"model": Readiness}})
async def readyz(state: State) -> JSONResponse:
    database, outbox, hold = CheckState.OK, None, False
    try:
        outbox, hold = await asyncio.wait_for(_database(state), CHECK_TIMEOUT_S)
    except (SQLAlchemyError, OSError, TimeoutError) as exc:
        logger.warning("readiness: database %s", type(exc).__name__)
        database = CheckState.UNREACHABLE
    nats = CheckState.OK if await state.broker.ping(CHECK_TIMEOUT_S) else CheckState.UNREACHABLE
    failing = await _failing(state)
    ready = (
        database is CheckState.OK
        and nats is CheckState.OK
        and outbox is not None
        and outbox.state is CheckState.OK
        and not failing
    )
    body = Readiness(
        ready=ready,
        database=database,
        nats=nats,
        outbox=outbox,
        partition_hold=hold,
        failing=failing,
    )
    return JSONResponse(body.model_dump(mode="json"), status_code=200 if ready else 503)
