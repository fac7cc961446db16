"""The FastAPI application factory. Stateless: everything lives in PostgreSQL."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime

from fastapi import FastAPI
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from api.admin.routes import router as admin_router
from api.agent.auth import warm
from api.agent.fast_path import FleetApp
from api.agent.routes import router as agent_router
from api.broker_link import BrokerLink
from api.docs import install_docs
from api.event_fanout import event_fanout
from api.gateway.cache import database_routes, gateway_cache
from api.gateway.limits import ClientLimits
from api.gateway.measurements import gateway_measurements
from api.gateway.relay import invoke_relay
from api.gateway.routes import router as gateway_router
from api.gateway.usage import gateway_usage
from api.handlers import install_exception_handlers
from api.health import router as health_router
from api.heartbeat_buffer import heartbeat_buffer
from api.held_streams import HeldStreams
from api.loop_health import loop_health
from api.manifests import ManifestResolver
from api.metrics import ApiMetrics
from api.middleware.access_log import AccessLogMiddleware
from api.middleware.body_limit import BodySizeLimitMiddleware
from api.middleware.correlation import CorrelationIdMiddleware
from api.middleware.utf8_body import Utf8BodyMiddleware
from api.model_headers import ModelHeaders
from api.node_cache import NodeCache, node_cache
from api.notifications import notification_hub
from api.presence import presence_beat
from api.return_batch import return_batcher
from api.settings import ApiSettings
from api.shedding import LoadShedder
from api.state import ApiState
from api.telemetry_batch import telemetry_batcher
from api.ui.revocations import shared_logouts
from api.ui.routes import Assets, ui_router
from api.ui.session import UiSessions
from schemas.protocol import INVOKE_STREAM
from store.engine import make_engine, make_sessionmaker

logger = logging.getLogger("modelforge.api")


async def _warm(
    cache: NodeCache,
    sessions: async_sessionmaker[AsyncSession],
    observe: Callable[[datetime], None],
) -> None:
    try:
        stored = await warm(cache, sessions, observe)
    except (OSError, SQLAlchemyError) as exc:
        # Not fatal: the cache then fills one transactional heartbeat at a time.
        logger.warning("the node cache was not warmed: %s", type(exc).__name__)
        return
    logger.info("node cache warmed with %d credentials of online nodes", stored)


def create_app(settings: ApiSettings, held_streams: HeldStreams | None = None) -> FastAPI:
    """held_streams: the registry the server ends when it begins to stop (api/server.py);
    a server that never calls close_all leaves held streams to end by themselves."""
    metrics = ApiMetrics()
    operator_key = settings.operator_api_key
    ui_sessions = UiSessions(operator_key.get_secret_value() if operator_key else None)
    shedder = LoadShedder(settings.shed_in_flight, settings.heartbeat_interval_s, metrics)
    held = held_streams if held_streams is not None else HeldStreams()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not settings.admin_enabled:
            logger.warning(
                "ADMIN API DISABLED: MODELFORGE_OPERATOR_API_KEY is unset or empty; "
                "every /api/v1/admin route will answer 403"
            )
        engine = make_engine(settings.database_url, pool_size=settings.db_pool_size)
        broker = BrokerLink(settings.nats_url)
        token = settings.artifact_source_token
        manifests = ManifestResolver(
            settings.artifact_source_url, token.get_secret_value() if token else None
        )
        model_headers = ModelHeaders(
            settings.artifact_source_url,
            token.get_secret_value() if token else None,
            settings.model_header_timeout_s,
            settings.model_header_max_bytes,
        )
        sessions = make_sessionmaker(engine)
        try:
            async with (
                loop_health(metrics.registry),
                node_cache(settings.database_url) as cache,
                gateway_cache(
                    settings.database_url,
                    database_routes(sessions),
                    routes_max_age_s=settings.gateway_routes_max_age_s,
                ) as gateway,
                notification_hub(settings.nats_url) as notifications,
                event_fanout(settings.nats_url) as events,
                invoke_relay(
                    settings.nats_url, delivery_timeout_s=settings.gateway_delivery_timeout_s
                ) as invokes,
                gateway_measurements(
                    sessions, invokes.id, settings.gateway_measure_interval_s
                ) as measurements,
                gateway_usage(sessions, settings.gateway_measure_interval_s, metrics) as usage,
                heartbeat_buffer(
                    sessions, settings.heartbeat_flush_s, metrics.heartbeats_flushed
                ) as heartbeats,
                telemetry_batcher(sessions, settings.future_skew_limit_s, metrics) as telemetry,
                return_batcher(
                    sessions,
                    cache if settings.heartbeat_cache else None,
                    heartbeats,
                    settings.heartbeat_interval_s,
                    metrics,
                ) as returns,
                presence_beat(
                    sessions,
                    period_s=settings.beat_period_s,
                    gap_s=settings.gap_s,
                    merge_within_s=settings.stale_after_s + settings.restart_grace_s,
                    listener=(settings.host, settings.port),
                    shedder=shedder,
                ),
                shared_logouts(settings.database_url, sessions, ui_sessions),
            ):
                app.state.modelforge = ApiState(
                    settings=settings,
                    engine=engine,
                    sessions=sessions,
                    broker=broker,
                    metrics=metrics,
                    node_cache=cache,
                    heartbeats=heartbeats,
                    manifests=manifests,
                    model_headers=model_headers,
                    notifications=notifications,
                    held_streams=held,
                    invokes=invokes,
                    client_limits=ClientLimits(),
                    gateway_cache=gateway,
                    measurements=measurements,
                    usage=usage,
                    telemetry=telemetry,
                    returns=returns,
                    events=events,
                    shedder=shedder,
                )
                warming = asyncio.create_task(_warm(cache, sessions, heartbeats.observe))
                # Serving starts after the lifespan's startup; with --processes the
                # connections that arrive meanwhile wait in the shared socket's backlog.
                await asyncio.wait({warming}, timeout=settings.node_cache_warm_wait_s)
                try:
                    yield
                finally:
                    warming.cancel()
        finally:
            await manifests.close()
            await model_headers.close()
            await broker.close()
            await engine.dispose()

    # The fleet's routine heartbeats and cached telemetry are looked at before anything
    # else, the middleware included (api/agent/fast_path.py).
    app = FleetApp(
        metrics=metrics,
        max_body_bytes=settings.max_body_bytes,
        title="ModelForge control plane",
        version="1",
        lifespan=lifespan,
        # FastAPI's own pages load their assets from a CDN: ours are served from the
        # package (api/docs.py), so /docs works on an offline host.
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    install_exception_handlers(app)
    # Added last = outermost: the correlation id exists before anything logs or answers.
    # An invoke's answer stream is llama-server's bytes, bounded by its route.
    streamed = (INVOKE_STREAM.split("{", 1)[0],)
    app.add_middleware(Utf8BodyMiddleware, streamed_prefixes=streamed)
    app.add_middleware(
        BodySizeLimitMiddleware, max_bytes=settings.max_body_bytes, streamed_prefixes=streamed
    )
    app.add_middleware(AccessLogMiddleware, metrics=metrics)
    app.add_middleware(CorrelationIdMiddleware)
    # Routes are matched in order, one by one: the hot ones first (the gateway's two, then
    # the fleet's), so an invoke or a heartbeat is not matched against the admin API's.
    app.include_router(gateway_router)
    app.include_router(agent_router)
    app.include_router(health_router)
    app.include_router(admin_router)
    # The dashboard (api/ui/); its session cookie stands in for the operator key in the
    # admin router's check (api/deps.py), which finds it on app.state.
    app.state.ui_sessions = ui_sessions
    app.include_router(ui_router(ui_sessions, Assets.load()))
    # Last: an operator's page is never matched ahead of a fleet route.
    install_docs(app)
    return app
