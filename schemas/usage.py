"""The gateway's usage per service client and served model (issue 33), as the rollup
keeps it (store/rollup/usage.py, table usage_minutes) and the admin API serves it.

Route (operator key or dashboard session):

    GET /api/v1/admin/usage   (USAGE)
        ?since=RFC3339 &until=RFC3339   half-open [since, until); until defaults to now,
                                         since to until minus DEFAULT_RANGE[step]; the
                                         range may not exceed MAX_RANGE[step] (else 422)
        &client=UUID                     one service client (optional)
        &model=NAME                      one served model (optional)
        &step=minute|hour|day            bucket size (default hour); buckets start on
                                         UTC boundaries
        &limit=1..10000                  rows (default 1000); `truncated` says more exist
    -> UsageReport: {since, until, step, rows: [UsageRow], totals: UsageTotals,
                     truncated}

A row is one (bucket start, client, model): requests (every outcome), `errors` by code
(every outcome other than "ok"), tokens, and the time to first token's p50/p99 from the
summed buckets. Totals cover the whole range and filters, not only the rows returned.

Time to first token is kept as counts per bucket of TTFT_BUCKETS_S (upper bounds in
seconds, the last +inf): buckets add up across processes and minutes, so the
percentiles of any range come from summed counts (`quantile_s`), estimated by linear
interpolation within the bucket (as Prometheus' histogram_quantile does).
"""

from __future__ import annotations

import bisect
import math
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Annotated, Final

from pydantic import Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from schemas.base import CountParam, FilterText, Timestamp, WireModel
from schemas.protocol import ADMIN_PREFIX

USAGE: Final = f"{ADMIN_PREFIX}/usage"

# Upper bounds (seconds) of the time-to-first-token buckets; the last is +inf. Changing
# them changes the meaning of stored counts: append only, never move a bound.
TTFT_BUCKETS_S: Final[tuple[float, ...]] = (
    0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 30.0, 60.0,
    math.inf,
)  # fmt: skip

# What the gateway records as the outcome of an invoke that succeeded; any other outcome
# is the error code its client got.
OUTCOME_OK: Final = "ok"


def ttft_bucket(seconds: float) -> int:
    """The index of the bucket a time to first token falls in (bounds are inclusive)."""
    if math.isnan(seconds):
        return len(TTFT_BUCKETS_S) - 1
    return bisect.bisect_left(TTFT_BUCKETS_S, max(seconds, 0.0))


def empty_buckets() -> tuple[int, ...]:
    return (0,) * len(TTFT_BUCKETS_S)


def quantile_s(buckets: Sequence[int], q: float) -> float | None:
    """The q-quantile (0 < q < 1) of the times counted in `buckets`, interpolated within
    its bucket; None without samples. A quantile in the +inf bucket is the last finite
    bound (all that can be said: at least that)."""
    total = sum(buckets)
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for index, count in enumerate(buckets):
        if count and seen + count >= rank:
            upper = TTFT_BUCKETS_S[index]
            lower = TTFT_BUCKETS_S[index - 1] if index else 0.0
            if math.isinf(upper):
                return lower
            return lower + (upper - lower) * (rank - seen) / count
        seen += count
    return TTFT_BUCKETS_S[-2]


class UsageStep(StrEnum):
    MINUTE = "minute"
    HOUR = "hour"
    DAY = "day"


STEP_SIZE: Final = {
    UsageStep.MINUTE: timedelta(minutes=1),
    UsageStep.HOUR: timedelta(hours=1),
    UsageStep.DAY: timedelta(days=1),
}
DEFAULT_RANGE: Final = {
    UsageStep.MINUTE: timedelta(hours=1),
    UsageStep.HOUR: timedelta(hours=24),
    UsageStep.DAY: timedelta(days=30),
}
# At most a few thousand buckets per client and model.
MAX_RANGE: Final = {
    UsageStep.MINUTE: timedelta(days=1),
    UsageStep.HOUR: timedelta(days=93),
    UsageStep.DAY: timedelta(days=1000),
}
UsageLimit = Annotated[CountParam, Field(ge=1, le=10_000)]


# The rule on a range JSON Schema cannot state (it relates two parameters and the
# clock): every refusal of a range says it.
RANGE_RULE: Final = "since must be before until"


def range_refusal(step: UsageStep) -> str:
    longest = MAX_RANGE[step].days
    days = "1 day" if longest == 1 else f"{longest} days"
    return f"{RANGE_RULE}, at most {days} before it with step={step.value}"


class UsageQuery(WireModel):
    """Query parameters of USAGE (text on the wire)."""

    since: Timestamp | None = Field(
        default=None,
        description=f"{RANGE_RULE}, at most 1 day before it with step=minute, 93 days with"
        " hour, 1000 days with day; default: until minus 1 hour, 24 hours or 30 days",
    )
    until: Timestamp | None = Field(default=None, description="default: now")
    client: uuid.UUID | None = Field(default=None, description="a service client's id")
    model: FilterText | None = Field(default=None, description="a served model name")
    step: UsageStep = UsageStep.HOUR
    limit: UsageLimit = 1000

    @model_validator(mode="after")
    def _bounded_range(self) -> UsageQuery:
        until = self.until or datetime.now(UTC)
        try:
            since = self.since or until - DEFAULT_RANGE[self.step]
        except OverflowError:  # an until in the first days of year 1
            raise self._refused("until", self.until) from None
        if not since < until or until - since > MAX_RANGE[self.step]:
            # since names the range when it was given; until moved a default one.
            raise self._refused(*(("since", self.since) if self.since else ("until", until)))
        return self

    def _refused(self, name: str, value: object) -> ValidationError:
        """The range's refusal located at the parameter it names (a model's own error
        would name none)."""
        error = PydanticCustomError("value_error", range_refusal(self.step))
        details = InitErrorDetails(type=error, loc=(name,), input=value)
        return ValidationError.from_exception_data(type(self).__name__, [details])


class UsageCounts(WireModel):
    """Invokes of a row or of the totals, every outcome."""

    requests: int
    # Error code -> invokes that ended with it (no "ok").
    errors: dict[str, int]
    prompt_tokens: int
    completion_tokens: int
    ttft_count: int
    ttft_p50_s: float | None
    ttft_p99_s: float | None


class UsageRow(UsageCounts):
    """One bucket of one client's invokes of one model."""

    start: datetime
    client_id: uuid.UUID
    # None once the client is gone from the table (never, as clients are revoked).
    client_name: str | None
    model: str


class UsageTotals(UsageCounts):
    """The whole range's invokes, every filter applied."""


class UsageReport(WireModel):
    since: datetime
    until: datetime
    step: UsageStep
    # Ordered by start, then client id, then model.
    rows: list[UsageRow]
    totals: UsageTotals
    # More rows matched than `limit`: narrow the range or the filters, or a coarser step.
    truncated: bool
