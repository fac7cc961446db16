"""The gateway's usage per service client and model (schemas/usage.py: USAGE), from
the rollup (store/rollup/usage_report.py). Included in the admin router (operator
check)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query

from api.deps import AdminTransaction
from schemas.errors import ErrorCode
from schemas.usage import (
    DEFAULT_RANGE,
    MAX_RANGE,
    USAGE,
    UsageQuery,
    UsageReport,
    range_refusal,
)
from store.errors import Invalid
from store.rollup import usage_report
from store.rollup.usage_report import Filters

router = APIRouter()


def filters(query: UsageQuery, now: datetime) -> Filters:
    """The query's range made explicit: until defaults to now, since to a default span
    before it. The query refused a range that is empty, reversed or too long (422) when
    it was read; a clock that moved since is refused the same way."""
    until = (query.until or now).astimezone(UTC)
    try:
        since = (query.since or until - DEFAULT_RANGE[query.step]).astimezone(UTC)
    except OverflowError:
        since = until
    if not since < until or until - since > MAX_RANGE[query.step]:
        raise Invalid(range_refusal(query.step), code=ErrorCode.VALIDATION_FAILED)
    return Filters(since, until, query.client, query.model)


@router.get(USAGE)
async def usage(session: AdminTransaction, query: Annotated[UsageQuery, Query()]) -> UsageReport:
    """Invokes per step, service client and model: requests, errors by code, tokens,
    time to first token (p50/p99), and the totals of the range."""
    return await usage_report.report(
        session, filters(query, datetime.now(UTC)), query.step, query.limit
    )
