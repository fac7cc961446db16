"""Liveness computed on read from server-received heartbeat time (never the agent's clock)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import ColumnElement, case, func, literal, text

from schemas.admin import Liveness
from store.models import Node


@dataclass(frozen=True)
class LivenessThresholds:
    stale_after_s: float
    offline_after_s: float


def liveness_expression(thresholds: LivenessThresholds) -> ColumnElement[str]:
    """SQL for a node's liveness, evaluated against the database clock."""
    now = func.statement_timestamp()
    stale = func.make_interval(0, 0, 0, 0, 0, 0, literal(thresholds.stale_after_s))
    offline = func.make_interval(0, 0, 0, 0, 0, 0, literal(thresholds.offline_after_s))
    return case(
        (Node.decommissioned_at.is_not(None), text("'decommissioned'")),
        (Node.enabled.is_(False), text("'disabled'")),
        (Node.last_heartbeat_at.is_(None), text("'offline'")),
        (Node.last_heartbeat_at > now - stale, text("'online'")),
        (Node.last_heartbeat_at > now - offline, text("'stale'")),
        else_=text("'offline'"),
    )


def as_liveness(value: str) -> Liveness:
    return Liveness(value)
