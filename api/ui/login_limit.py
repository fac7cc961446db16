"""A bound on wrong operator keys at the dashboard's login: guessing is slowed to a
handful of tries per client per window, answered 429 with Retry-After.

The operator key is long and random, so this is not what keeps it secret; it keeps a
script from hammering the form (each try costs a constant-time compare and a log line)
and makes a guessing attempt loud. Counted per client address and per API process: a
multi-process API multiplies the bound by its processes, which still leaves guessing
hopeless. Memory is bounded: at most `max_clients` addresses are tracked, the oldest
forgotten first. A successful login clears its address.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

# Five wrong keys a minute per address: enough for an operator's typos.
MAX_FAILURES = 5
WINDOW_S = 60.0
MAX_CLIENTS = 10_000


@dataclass
class LoginLimiter:
    max_failures: int = MAX_FAILURES
    window_s: float = WINDOW_S
    max_clients: int = MAX_CLIENTS
    clock: Callable[[], float] = time.monotonic
    # Address -> the times of its failures within the window, oldest first.
    _failures: OrderedDict[str, list[float]] = field(default_factory=OrderedDict)

    def _recent(self, client: str) -> list[float]:
        horizon = self.clock() - self.window_s
        times = [t for t in self._failures.get(client, []) if t > horizon]
        if times:
            self._failures[client] = times
        else:
            self._failures.pop(client, None)
        return times

    def retry_after_s(self, client: str) -> int | None:
        """None: this address may try; else whole seconds until its oldest failure in
        the window expires."""
        times = self._recent(client)
        if len(times) < self.max_failures:
            return None
        return max(1, math.ceil(times[0] + self.window_s - self.clock()))

    def failed(self, client: str) -> None:
        times = self._recent(client)
        times.append(self.clock())
        self._failures[client] = times
        self._failures.move_to_end(client)
        while len(self._failures) > self.max_clients:
            self._failures.popitem(last=False)

    def succeeded(self, client: str) -> None:
        self._failures.pop(client, None)
