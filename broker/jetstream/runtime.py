"""What the broker shares with its consumers: loop, connection, names, in-flight set."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext

from broker.jetstream.dead_letters import Reason
from broker.jetstream.inflight import InFlight
from broker.jetstream.loop import LoopThread
from broker.jetstream.names import Names
from broker.jetstream.settings import BrokerSettings

# Called (on the loop thread) after a message was moved to the dead-letter stream.
DeadLetterListener = Callable[[str, Reason], None]


@dataclass(frozen=True)
class Runtime:
    settings: BrokerSettings
    names: Names
    loop: LoopThread
    nc: NatsClient
    js: JetStreamContext
    inflight: InFlight
    on_dead_letter: DeadLetterListener
    # True if this process declared an actor of that name (see intake.py).
    knows_actor: Callable[[str], bool]

    @property
    def call_timeout_s(self) -> float:
        """Bound on one bridged call; the longest (dead-lettering: publish, then
        ack_sync) holds two server requests, each bounded by api_timeout_s."""
        return self.settings.api_timeout_s * 3
