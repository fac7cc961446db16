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


class FailingChild(WireModel):
    """A process of the stack that keeps dying and is being retried (`modelforge up`)."""

    # As `up` names it: "modelforge worker", "nats-server".
    name: str
    # e.g. "exited 6 times within 60s (last exit status 1)".
    reason: str


class Readiness(WireModel):
    """200 when everything answers; 503 otherwise. The partition hold never makes an
    API unready (refusing agents then would turn a suspected partition into a real one);
    it is shown here so that a glance at one URL tells the whole story."""

    ready: bool
    database: CheckState
    nats: CheckState
    outbox: OutboxState | None
    partition_hold: bool
    # Under `modelforge up`: the children its supervisor reports failing (a crash loop
    # of one the API can do without, such as the worker). Any makes the API unready:
    # changes are accepted, but do not reach their consumers.
    failing: list[FailingChild] = []
