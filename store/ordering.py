"""The ordering rules of protocol v1, as one pure decision over a stream's cursor.

* sequence <= cursor: a replay, refused (409); nothing changes.
* otherwise the cursor advances, and the sample replaces last-good state unless its
  observed_at is older than last-good's, or further ahead of the server clock than
  the future-skew limit. Such a sample is "not applied" and the reason stays on the
  stream until a good one arrives.

Pure, so the fast tier tests it directly (tests/test_ordering_decide.py); store/ingest.py
applies it to a stream's row.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from schemas.agent import NotAppliedReason


@dataclass(frozen=True)
class Decision:
    replay: bool
    reason: NotAppliedReason | None = None

    @property
    def applied(self) -> bool:
        return not self.replay and self.reason is None


def decide(
    *,
    cursor: int,
    good_observed_at: datetime | None,
    sequence: int,
    observed_at: datetime,
    received_at: datetime,
    future_skew_limit: timedelta,
) -> Decision:
    if sequence <= cursor:
        return Decision(replay=True)
    if observed_at > received_at + future_skew_limit:
        return Decision(replay=False, reason=NotAppliedReason.OBSERVED_IN_FUTURE)
    if good_observed_at is not None and observed_at < good_observed_at:
        return Decision(replay=False, reason=NotAppliedReason.OBSERVED_BEFORE_LAST_GOOD)
    return Decision(replay=False)
