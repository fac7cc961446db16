"""JetStream stream declarations, applied idempotently at start-up by every publisher."""

from __future__ import annotations

from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.api import Placement, StorageType, StreamConfig, StreamInfo

from broker.jetstream.declare import declare_stream
from schemas.protocol import EVENTS_STREAM

__all__ = ["EVENTS_STREAM"]

EVENTS_SUBJECTS = ["modelforge.v1.>"]
# Nats-Msg-Id dedupe horizon: a relay that crashed after publishing but before
# marking the row sent republishes well inside this window.
DUPLICATE_WINDOW_S = 120.0


@dataclass(frozen=True)
class StreamSpec:
    name: str
    subjects: list[str]
    duplicate_window_s: float
    max_age_s: float
    replicas: int = 1
    placement: Placement | None = None

    def config(self) -> StreamConfig:
        return StreamConfig(
            name=self.name,
            subjects=list(self.subjects),
            storage=StorageType.FILE,
            duplicate_window=self.duplicate_window_s,
            max_age=self.max_age_s,
            num_replicas=self.replicas,
            placement=self.placement,
        )


def events_stream(replicas: int = 1, placement: Placement | None = None) -> StreamSpec:
    """The node event stream. Its durable consumers (audit, reconcile, anyone's) leave
    their replicas unset and so have the stream's."""
    return StreamSpec(
        name=EVENTS_STREAM,
        subjects=EVENTS_SUBJECTS,
        duplicate_window_s=DUPLICATE_WINDOW_S,
        max_age_s=7 * 24 * 3600.0,
        replicas=replicas,
        placement=placement,
    )


async def declare(js: JetStreamContext, spec: StreamSpec) -> StreamInfo:
    """Create the stream, or bring an existing one to this configuration."""
    return await declare_stream(js, spec.config())
