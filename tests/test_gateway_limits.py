"""A service client's per-process bounds (api/gateway/limits.py): concurrency and the
token bucket, on a fake clock. Fast: no services."""

from __future__ import annotations

import uuid

import pytest

from api.gateway.limits import Admission, ClientLimits, LimitExceeded
from api.gateway.scope import ClientScope

pytestmark = pytest.mark.fast


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def scope(max_concurrent: int | None = None, rate_per_minute: int | None = None) -> ClientScope:
    return ClientScope(
        client_id=uuid.uuid4(),
        name="svc",
        models=frozenset({"m"}),
        roles=frozenset(),
        max_concurrent=max_concurrent,
        rate_per_minute=rate_per_minute,
    )


def refused(limits: ClientLimits, client: ClientScope) -> LimitExceeded:
    with pytest.raises(LimitExceeded) as caught:
        limits.admit(client)
    return caught.value


def test_unbounded_client_is_always_admitted_and_forgotten() -> None:
    limits = ClientLimits(Clock())
    client = scope()
    held = [limits.admit(client) for _ in range(1000)]
    assert limits.in_flight(client.client_id) == 1000
    for admission in held:
        admission.release()
    assert limits.in_flight(client.client_id) == 0
    assert not limits._usage


def test_concurrency_bound_and_release() -> None:
    limits = ClientLimits(Clock())
    client = scope(max_concurrent=2)
    first, second = limits.admit(client), limits.admit(client)
    over = refused(limits, client)
    assert (over.code, over.retry_after_s) == ("concurrency_limited", 1)
    first.release()
    first.release()  # twice is harmless: it frees one slot, not two
    third = limits.admit(client)
    assert refused(limits, client).code == "concurrency_limited"
    second.release()
    third.release()
    assert limits.in_flight(client.client_id) == 0


def test_admission_as_context_manager_releases_on_error() -> None:
    limits = ClientLimits(Clock())
    client = scope(max_concurrent=1)
    with pytest.raises(RuntimeError), limits.admit(client) as admission:
        assert isinstance(admission, Admission)
        assert refused(limits, client).code == "concurrency_limited"
        raise RuntimeError("the upstream failed")
    with limits.admit(client):
        pass
    assert limits.in_flight(client.client_id) == 0


def test_bounds_are_per_client() -> None:
    limits = ClientLimits(Clock())
    one, other = scope(max_concurrent=1, rate_per_minute=1), scope(max_concurrent=1)
    limits.admit(one)
    assert refused(limits, one).code == "concurrency_limited"
    limits.admit(other)
    assert limits.in_flight(other.client_id) == 1


def test_bucket_bursts_a_minute_then_refills_at_rate() -> None:
    clock = Clock()
    limits = ClientLimits(clock)
    client = scope(rate_per_minute=6)  # one token every 10 s
    for _ in range(6):
        limits.admit(client).release()
    over = refused(limits, client)
    assert (over.code, over.retry_after_s) == ("rate_limited", 10)
    clock.now += 4
    assert refused(limits, client).retry_after_s == 6
    clock.now += 5.5
    # Half a second short of a token: still refused, and told to wait at least 1 s.
    assert refused(limits, client).retry_after_s == 1
    clock.now += 0.5
    limits.admit(client).release()
    assert refused(limits, client).retry_after_s == 10
    # A long pause refills to capacity, never beyond it.
    clock.now += 3600
    for _ in range(6):
        limits.admit(client).release()
    assert refused(limits, client).code == "rate_limited"


def test_fast_rate_retry_after_is_at_least_one_second() -> None:
    clock = Clock()
    limits = ClientLimits(clock)
    client = scope(rate_per_minute=600)  # ten a second
    for _ in range(600):
        limits.admit(client).release()
    assert refused(limits, client).retry_after_s == 1
    clock.now += 0.1
    limits.admit(client).release()


def test_concurrency_refusal_spends_no_token() -> None:
    clock = Clock()
    limits = ClientLimits(clock)
    client = scope(max_concurrent=1, rate_per_minute=2)
    held = limits.admit(client)
    for _ in range(5):
        assert refused(limits, client).code == "concurrency_limited"
    held.release()
    # One token left of two: the refusals above spent none.
    limits.admit(client).release()
    assert refused(limits, client).code == "rate_limited"


def test_rate_refusal_takes_no_slot() -> None:
    clock = Clock()
    limits = ClientLimits(clock)
    client = scope(max_concurrent=1, rate_per_minute=1)
    held = limits.admit(client)
    held.release()
    assert refused(limits, client).code == "rate_limited"
    assert limits.in_flight(client.client_id) == 0
    clock.now += 60
    limits.admit(client)
    assert limits.in_flight(client.client_id) == 1


def test_spent_bucket_is_remembered_after_release_and_full_one_forgotten() -> None:
    clock = Clock()
    limits = ClientLimits(clock)
    client = scope(rate_per_minute=1)
    limits.admit(client).release()
    # Not forgotten while the bucket is short: forgetting would hand out a new minute.
    assert refused(limits, client).code == "rate_limited"
    clock.now += 60
    limits.admit(client).release()
    clock.now += 60
    with limits.admit(client):
        clock.now += 120
    assert client.client_id not in limits._usage


def test_a_lowered_rate_clamps_the_bucket() -> None:
    clock = Clock()
    limits = ClientLimits(clock)
    client = scope(rate_per_minute=100)
    limits.admit(client).release()
    lowered = ClientScope(**{**client.__dict__, "rate_per_minute": 2})
    limits.admit(lowered).release()
    limits.admit(lowered).release()
    assert refused(limits, lowered).code == "rate_limited"
