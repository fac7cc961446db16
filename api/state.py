"""What the API process holds while it runs: built in the lifespan, reached through request.app."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from starlette.requests import Request

from api.broker_link import BrokerLink
from api.event_fanout import EventFanout
from api.gateway.cache import GatewayCache
from api.gateway.limits import ClientLimits
from api.gateway.measurements import GatewayMeasurements
from api.gateway.relay import InvokeRelay
from api.gateway.usage import GatewayUsage
from api.heartbeat_buffer import HeartbeatBuffer
from api.held_streams import HeldStreams
from api.manifests import ManifestResolver
from api.metrics import ApiMetrics
from api.model_headers import ModelHeaders
from api.node_cache import NodeCache
from api.notifications import NotificationHub
from api.return_batch import ReturnBatcher
from api.settings import ApiSettings
from api.shedding import LoadShedder
from api.telemetry_batch import TelemetryBatcher
from broker.jetstream.names import Names
from store.leases import LeasePolicy
from store.liveness import LivenessThresholds


@dataclass
class ApiState:
    settings: ApiSettings
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    broker: BrokerLink
    metrics: ApiMetrics
    node_cache: NodeCache
    heartbeats: HeartbeatBuffer
    manifests: ManifestResolver
    # A service's GGUF header, for its memory estimate (api/admin/services.py).
    model_headers: ModelHeaders
    notifications: NotificationHub
    held_streams: HeldStreams
    invokes: InvokeRelay
    client_limits: ClientLimits
    gateway_cache: GatewayCache
    # The gateway's measurements per served model, written for autoscale.
    measurements: GatewayMeasurements
    # Every invoke per service client, model and minute, and the clients' budgets.
    usage: GatewayUsage
    telemetry: TelemetryBatcher
    # Heartbeats of nodes the cache does not hold, group-committed (api/return_batch.py).
    returns: ReturnBatcher
    # The operators' event stream's fan-out (api/event_fanout.py; its route api/admin/events.py).
    events: EventFanout
    # Refuses node requests past the transactional path's bound (api/shedding.py).
    shedder: LoadShedder

    @property
    def leases(self) -> LeasePolicy:
        return self.settings.lease_policy()

    @property
    def broker_names(self) -> Names:
        return Names(self.settings.broker_namespace)

    @property
    def thresholds(self) -> LivenessThresholds:
        return LivenessThresholds(
            stale_after_s=self.settings.stale_after_s,
            offline_after_s=self.settings.offline_after_s,
            restart_grace_s=self.settings.restart_grace_s,
            presence_gap_s=self.settings.gap_s,
        )


def state_of(request: Request) -> ApiState:
    state: ApiState = request.app.state.modelforge
    return state


async def get_state(request: Request) -> ApiState:
    """The dependency. async, though it awaits nothing: FastAPI runs a plain-def
    dependency in a worker thread, a thread hop on every request."""
    return state_of(request)
