"""store/ordering.py: decide, the ordering rules of protocol v1, directly.

Per stream: a sequence at or below the cursor is a replay (409, nothing changes);
any higher sequence advances the cursor (gaps included), and its sample replaces
last-good state unless observed beyond the server clock + future-skew limit or
before last-good's observed_at (equal is not before). test_ordering_model.py checks
the same rules through the API; these pin each branch, its boundaries and which
rule wins when several apply.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta, timezone

import pytest

from schemas.agent import NotAppliedReason
from store.ordering import Decision, decide

pytestmark = pytest.mark.fast

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
SKEW = timedelta(minutes=5)  # the protocol's default future-skew limit
TICK = timedelta(microseconds=1)
GOOD = NOW - timedelta(minutes=1)

APPLIED = Decision(replay=False)
REPLAY = Decision(replay=True)
IN_FUTURE = Decision(replay=False, reason=NotAppliedReason.OBSERVED_IN_FUTURE)
BEFORE_GOOD = Decision(replay=False, reason=NotAppliedReason.OBSERVED_BEFORE_LAST_GOOD)


def decision(
    *,
    cursor: int = 10,
    good: datetime | None = GOOD,
    sequence: int = 11,
    observed_at: datetime = NOW,
    received_at: datetime = NOW,
    skew: timedelta = SKEW,
) -> Decision:
    return decide(
        cursor=cursor,
        good_observed_at=good,
        sequence=sequence,
        observed_at=observed_at,
        received_at=received_at,
        future_skew_limit=skew,
    )


def test_the_next_sequence_observed_now_is_applied() -> None:
    result = decision()
    assert result == APPLIED
    assert result.applied and not result.replay and result.reason is None


def test_the_first_sample_of_a_stream_is_applied_whenever_it_was_observed() -> None:
    # A new stream: cursor 0, no last-good state, so nothing can be "before" it.
    assert decision(cursor=0, good=None, sequence=1) == APPLIED
    assert decision(cursor=0, good=None, sequence=1, observed_at=NOW - timedelta(days=365)) == (
        APPLIED
    )


def test_a_gap_in_the_sequence_is_accepted() -> None:
    assert decision(cursor=10, sequence=12) == APPLIED
    assert decision(cursor=10, sequence=1_000_000) == APPLIED
    assert decision(cursor=0, good=None, sequence=2**53) == APPLIED


@pytest.mark.parametrize("sequence", [10, 9, 1, 0])
def test_a_sequence_at_or_below_the_cursor_is_a_replay(sequence: int) -> None:
    result = decision(cursor=10, sequence=sequence)
    assert result == REPLAY
    assert result.replay and not result.applied and result.reason is None


def test_a_replay_wins_over_every_other_rule() -> None:
    """The cursor check comes first: a replayed sample is refused, never "not applied",
    whatever its timestamps (so the stream's reason is not touched)."""
    far_future = NOW + SKEW + timedelta(hours=1)
    long_before = GOOD - timedelta(hours=1)
    assert decision(cursor=10, sequence=10, observed_at=far_future) == REPLAY
    assert decision(cursor=10, sequence=3, observed_at=long_before) == REPLAY
    assert decision(cursor=0, good=None, sequence=0) == REPLAY


def test_an_observation_older_than_last_good_advances_but_is_not_applied() -> None:
    result = decision(observed_at=GOOD - TICK)
    assert result == BEFORE_GOOD
    assert not result.applied and not result.replay
    assert decision(observed_at=GOOD - timedelta(days=1)) == BEFORE_GOOD


def test_an_observation_equal_to_last_good_is_applied() -> None:
    assert decision(observed_at=GOOD) == APPLIED
    assert decision(observed_at=GOOD + TICK) == APPLIED


def test_an_observation_beyond_the_future_skew_limit_is_not_applied() -> None:
    result = decision(observed_at=NOW + SKEW + TICK)
    assert result == IN_FUTURE
    assert not result.applied and not result.replay
    assert decision(observed_at=NOW + timedelta(days=1)) == IN_FUTURE


def test_an_observation_at_the_future_skew_limit_is_applied() -> None:
    assert decision(observed_at=NOW + SKEW) == APPLIED
    assert decision(observed_at=NOW + SKEW - TICK) == APPLIED


def test_the_limit_is_measured_from_the_server_clock_not_the_sample() -> None:
    observed = NOW + timedelta(minutes=10)
    assert decision(observed_at=observed, received_at=NOW) == IN_FUTURE
    assert decision(observed_at=observed, received_at=NOW + timedelta(minutes=5)) == APPLIED


def test_the_limit_is_configurable() -> None:
    ahead = NOW + timedelta(seconds=30)
    assert decision(observed_at=ahead, skew=timedelta(seconds=29)) == IN_FUTURE
    assert decision(observed_at=ahead, skew=timedelta(seconds=30)) == APPLIED
    assert decision(observed_at=NOW + TICK, skew=timedelta(0)) == IN_FUTURE
    assert decision(observed_at=NOW, skew=timedelta(0)) == APPLIED


def test_in_the_future_wins_over_before_last_good() -> None:
    """A last-good observation itself from the future (e.g. stored under a larger limit):
    a sample beyond the limit and before it is reported as in the future."""
    good = NOW + timedelta(hours=2)
    assert decision(good=good, observed_at=NOW + timedelta(hours=1)) == IN_FUTURE
    assert decision(good=good, observed_at=NOW) == BEFORE_GOOD


def test_timestamps_compare_as_instants_whatever_their_offset() -> None:
    plus_two = timezone(timedelta(hours=2))
    same_instant = GOOD.astimezone(plus_two)
    assert decision(observed_at=same_instant) == APPLIED
    assert decision(observed_at=(GOOD - TICK).astimezone(plus_two)) == BEFORE_GOOD
    # +14:00 reads 14 hours later on the wall clock: only the instant counts.
    kiribati = timezone(timedelta(hours=14))
    assert decision(observed_at=(NOW + SKEW).astimezone(kiribati)) == APPLIED
    assert decision(observed_at=(NOW + SKEW + TICK).astimezone(kiribati)) == IN_FUTURE


def test_a_decision_is_a_frozen_value() -> None:
    assert Decision(replay=False) == Decision(replay=False, reason=None)
    assert IN_FUTURE != BEFORE_GOOD
    with pytest.raises(dataclasses.FrozenInstanceError):
        APPLIED.replay = True  # type: ignore[misc]
