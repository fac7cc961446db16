"""Load shedding: past a bound of node requests waiting for the database, refuse the
next ones at once with 429 and Retry-After instead of queueing them until they time out.

Why: the requests that need a transaction (a heartbeat of a node this process does not
cache, telemetry or inventory of such a node: a fleet coming back after an outage) cost
many times a routine heartbeat. Queued without a bound, each waits behind all the
others, a wait that grows until the agents' timeouts fire and they retry on top of the
queue (the warm-up timeouts of ops/bench/fleet.py at 10,000 nodes). A refusal costs
microseconds; the agent honours Retry-After (agent/retry.py), spread here over a
heartbeat interval so the refused come back as a trickle, not as the same herd.

Hysteresis: shedding starts when `high` requests are in flight and stops only once
they drained to half that, so admission does not flap at the edge of the bound.

Routine heartbeats and cached telemetry (api/agent/fast_path.py) are never shed: they
need no transaction, and they are what keeps the fleet online. A shed heartbeat is one
the control plane did not hear: so that overload never turns into false transitions,
each shed is reported with the presence beat (api/presence.py) and the liveness sweep
records nothing while any API process shed within the last stale threshold
(store/fleet.py: shedding_recently).
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Iterator

from api.errors import TooManyRequests
from api.metrics import ApiMetrics
from schemas.errors import ErrorCode


class LoadShedder:
    def __init__(self, high: int, retry_after_max_s: float, metrics: ApiMetrics) -> None:
        # 0: never shed.
        self._high = high
        self._low = high // 2
        self._retry_after_max_s = max(1.0, retry_after_max_s)
        self._metrics = metrics
        self.in_flight = 0
        self.shedding = False
        # time.monotonic() of the last refusal; read by the presence beat.
        self.last_shed_at: float | None = None

    def shed_since(self, moment: float) -> bool:
        return self.last_shed_at is not None and self.last_shed_at >= moment

    def _admit(self) -> bool:
        if self._high <= 0:
            return True
        if self.in_flight >= self._high:
            self.shedding = True
        elif self.in_flight <= self._low:
            self.shedding = False
        return not self.shedding

    @contextlib.contextmanager
    def admitted(self, route: str) -> Iterator[None]:
        """Hold one place on the transactional path, or raise TooManyRequests."""
        if not self._admit():
            self.last_shed_at = time.monotonic()
            self._metrics.requests_shed.labels(route).inc()
            # Whole seconds (RFC 9110), spread so the refused do not return together.
            retry_after = math.ceil(random.uniform(1.0, self._retry_after_max_s))
            raise TooManyRequests(
                "the control plane is overloaded; retry after the time Retry-After gives",
                code=ErrorCode.OVERLOADED,
                headers={"Retry-After": str(retry_after)},
            )
        self.in_flight += 1
        self._metrics.requests_waiting.inc()
        try:
            yield
        finally:
            self.in_flight -= 1
            self._metrics.requests_waiting.dec()
