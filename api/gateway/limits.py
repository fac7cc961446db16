"""A service client's bounds, per API process: requests at once (max_concurrent) and
requests per minute (rate_per_minute, a token bucket). Pure Python, no I/O.

The bucket holds rate_per_minute tokens and refills at rate_per_minute / 60 a second,
so a client may burst up to a minute's allowance and then goes at its rate. A refusal
says how long to wait (Retry-After, whole seconds, at least 1): for the rate, until one
token is back; for concurrency, a second (when a request ends is not known here).

The bounds are this process's: with N API processes a client may get up to N times
them (schemas/service_clients.py says so). admit() and release() never await, so on one
event loop each is atomic without a lock.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal

from api.gateway.scope import ClientScope

LimitCode = Literal["concurrency_limited", "rate_limited"]
CONCURRENCY_LIMITED: LimitCode = "concurrency_limited"
RATE_LIMITED: LimitCode = "rate_limited"


class LimitExceeded(Exception):
    """Over one of the client's bounds (the gateway answers 429 with Retry-After)."""

    def __init__(self, code: LimitCode, retry_after_s: int) -> None:
        super().__init__(f"{code}: retry after {retry_after_s} s")
        self.code: LimitCode = code
        self.retry_after_s = retry_after_s


@dataclass
class _Usage:
    in_flight: int = 0
    # The bucket: tokens at `updated` (a clock reading), out of `capacity`.
    capacity: int | None = None
    tokens: float = 0.0
    updated: float = 0.0

    def refill(self, rate_per_minute: int, now: float) -> None:
        if self.capacity != rate_per_minute:
            # New, or the client's rate changed: start full at the new capacity, never
            # holding more than it.
            self.tokens = (
                float(rate_per_minute)
                if self.capacity is None
                else min(self.tokens, float(rate_per_minute))
            )
            self.capacity = rate_per_minute
        else:
            elapsed = max(0.0, now - self.updated)
            self.tokens = min(float(rate_per_minute), self.tokens + elapsed * rate_per_minute / 60)
        self.updated = now

    def idle(self, now: float) -> bool:
        """Holds nothing worth keeping: no request in flight, and a bucket that would be
        full by now (a fresh one starts full)."""
        if self.in_flight:
            return False
        if self.capacity is None:
            return True
        return self.tokens + (now - self.updated) * self.capacity / 60 >= self.capacity


@dataclass
class Admission:
    """One admitted request: release() (or leaving the `with` block) ends it. Releasing
    twice is harmless."""

    _limits: ClientLimits
    _client_id: uuid.UUID
    _released: bool = field(default=False)

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._limits._release(self._client_id)

    def __enter__(self) -> Admission:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class ClientLimits:
    """Every client's usage in this API process."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._usage: dict[uuid.UUID, _Usage] = {}

    def admit(self, scope: ClientScope) -> Admission:
        """Admit one request of this client, or raise LimitExceeded. The concurrency
        bound is checked first, so a request refused for it spends no token."""
        now = self._clock()
        usage = self._usage.setdefault(scope.client_id, _Usage())
        if scope.max_concurrent is not None and usage.in_flight >= scope.max_concurrent:
            raise LimitExceeded(CONCURRENCY_LIMITED, 1)
        if scope.rate_per_minute is not None:
            usage.refill(scope.rate_per_minute, now)
            if usage.tokens < 1:
                wait = (1 - usage.tokens) * 60 / scope.rate_per_minute
                raise LimitExceeded(RATE_LIMITED, max(1, math.ceil(wait - 1e-9)))
            usage.tokens -= 1
        else:
            usage.capacity = None
        usage.in_flight += 1
        return Admission(self, scope.client_id)

    def in_flight(self, client_id: uuid.UUID) -> int:
        usage = self._usage.get(client_id)
        return usage.in_flight if usage else 0

    def _release(self, client_id: uuid.UUID) -> None:
        usage = self._usage.get(client_id)
        if usage is None:
            return
        usage.in_flight = max(0, usage.in_flight - 1)
        # Forget a client that holds nothing: the table stays as small as the clients
        # calling right now.
        if usage.idle(self._clock()):
            del self._usage[client_id]
