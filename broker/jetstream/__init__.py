"""dramatiq broker on NATS JetStream (see README.md in this directory)."""

from broker.jetstream.broker import JetStreamBroker
from broker.jetstream.factory import build_broker, build_middleware
from broker.jetstream.middleware import AsyncResource, AsyncResourceMiddleware
from broker.jetstream.names import Names
from broker.jetstream.settings import BrokerSettings

__all__ = [
    "AsyncResource",
    "AsyncResourceMiddleware",
    "BrokerSettings",
    "JetStreamBroker",
    "Names",
    "build_broker",
    "build_middleware",
]
