"""Which ready deployment an invoke goes to: power of two choices on queue depth, then
the best probe evidence; deployments cooling down (they failed or timed out an invoke
lately) are left out. Pure: the gateway reads the routes (store/deployments/rules.py: routes)
and this process's own invokes in flight, and gets an order to try them in."""

from __future__ import annotations

import random
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from schemas.endpoints import Endpoint
from store.deployments.routing import Route


@dataclass(frozen=True)
class Choice:
    route: Route
    # Why it was picked (the route receipt says so): only, p2c:queue_depth,
    # p2c:probe_evidence, p2c:tie, retry.
    reason: str


def load(route: Route, local: Mapping[uuid.UUID, int]) -> int:
    """Invokes at once on it: what its node last reported, or what this process alone
    has in flight there if that is more (reports lag)."""
    return max(route.queue_depth, local.get(route.deployment_id, 0))


def _evidence(route: Route) -> tuple[float, float]:
    """Lower is better: time to first token, then generation speed (None: worst)."""
    ttft = route.time_to_first_token_s
    tps = route.generation_tokens_per_s
    return (ttft if ttft is not None else float("inf"), -(tps or 0.0))


def order(
    routes: Sequence[Route],
    local: Mapping[uuid.UUID, int],
    rng: random.Random,
    *,
    endpoint: Endpoint = "chat",
    needs_tools: bool = False,
) -> list[Choice]:
    """The deployments to try, first choice first: those that serve the endpoint (and
    call tools, when the request needs it); empty when all of them are cooling down."""
    live = [
        route
        for route in routes
        if not route.cooling and endpoint in route.endpoints and (route.tools or not needs_tools)
    ]
    if not live:
        return []
    if len(live) == 1:
        return [Choice(live[0], "only")]
    a, b = rng.sample(live, 2)
    load_a, load_b = load(a, local), load(b, local)
    if load_a != load_b:
        first, reason = (a if load_a < load_b else b), "p2c:queue_depth"
    elif _evidence(a) != _evidence(b):
        first, reason = min((a, b), key=_evidence), "p2c:probe_evidence"
    else:
        first, reason = a, "p2c:tie"
    rest = sorted(
        (route for route in live if route is not first),
        key=lambda route: (load(route, local), _evidence(route)),
    )
    return [Choice(first, reason)] + [Choice(route, "retry") for route in rest]
