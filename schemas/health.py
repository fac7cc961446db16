"""Readiness: what `/readyz` answers, ready or not."""

from __future__ import annotations

from enum import StrEnum

from schemas.base import WireModel


class CheckState(StrEnum):
    OK = "ok"
    # The dependency did not answer in time, or refused the connection.
    UNREACHABLE = "unreachable"
    # The relay is behind: events reach JetStream late.
    LAGGING = "lagging"


class OutboxState(WireModel):
    state: CheckState
    # Unsent events, counted up to one past the threshold.
    backlog: int
    # Age of the oldest unsent event; None when there is none.
    oldest_unsent_s: float | None


class Readiness(WireModel):
    """200 when everything answers; 503 otherwise. The partition hold never makes an
    API unready (refusing agents then would turn a suspected partition into a real one);
    it is shown here so that a glance at one URL tells the whole story."""

    ready: bool
    database: CheckState
    nats: CheckState
    outbox: OutboxState | None
    partition_hold: bool
