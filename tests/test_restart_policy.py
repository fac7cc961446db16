"""The supervisor's restart policy, on a fake clock (the fast tier: pure bookkeeping).

The real processes are killed in tests/test_up_supervisor.py.
"""

from __future__ import annotations

import pytest

from agent.supervisor import CrashLoop, RestartPolicy, Supervisor

pytestmark = pytest.mark.fast


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Child:
    """Dies when told to; counts its starts."""

    def __init__(self, *, fail_starts: int = 0) -> None:
        self.alive = True
        self.starts = 0
        self.fail_starts = fail_starts

    def start(self) -> None:
        self.starts += 1
        if self.fail_starts:
            self.fail_starts -= 1
            raise RuntimeError("port taken")
        self.alive = True

    def exit_status(self) -> int | None:
        return None if self.alive else -9

    def stop(self) -> None:
        self.alive = False


def restart_delays(supervisor: Supervisor, clock: Clock, child: Child, deaths: int) -> list[float]:
    """Kill the child `deaths` times, each time just after it came back; the delays seen."""
    delays = []
    for _ in range(deaths):
        child.alive = False
        supervisor.poll()
        state = supervisor.children[0].state
        assert state.restart_at is not None
        delays.append(round(state.restart_at - clock.now, 3))
        clock.now = state.restart_at
        supervisor.poll()
        assert child.alive
    return delays


def test_quick_exits_back_off_exponentially_up_to_a_cap() -> None:
    clock, child = Clock(), Child()
    policy = RestartPolicy(first_delay_s=0.5, max_delay_s=4, max_restarts=100, window_s=60)
    supervisor = Supervisor(policy, say=lambda _: None, clock=clock)
    supervisor.add("worker", child)
    assert restart_delays(supervisor, clock, child, 6) == [0.5, 1, 2, 4, 4, 4]
    assert child.starts == 6


def test_a_stable_run_resets_the_backoff() -> None:
    clock, child = Clock(), Child()
    policy = RestartPolicy(first_delay_s=0.5, stable_after_s=30, max_restarts=100)
    supervisor = Supervisor(policy, say=lambda _: None, clock=clock)
    supervisor.add("api", child)
    assert restart_delays(supervisor, clock, child, 3) == [0.5, 1, 2]
    clock.now += 31
    assert restart_delays(supervisor, clock, child, 1) == [0.5]


def test_a_crash_loop_is_reported_with_the_child_name() -> None:
    clock, child = Clock(), Child()
    policy = RestartPolicy(first_delay_s=0.5, max_restarts=3, window_s=60)
    supervisor = Supervisor(policy, say=lambda _: None, clock=clock)
    supervisor.add("nats-server", child)
    restart_delays(supervisor, clock, child, 3)
    child.alive = False
    with pytest.raises(CrashLoop, match=r"nats-server exited 4 times within 60s"):
        supervisor.poll()


def test_exits_spread_over_more_than_the_window_are_no_loop() -> None:
    clock, child = Clock(), Child()
    policy = RestartPolicy(max_restarts=2, window_s=10, stable_after_s=1)
    supervisor = Supervisor(policy, say=lambda _: None, clock=clock)
    supervisor.add("worker", child)
    for _ in range(10):
        clock.now += 11
        restart_delays(supervisor, clock, child, 1)
    assert child.starts == 10


def test_a_failed_start_counts_as_an_exit() -> None:
    clock, child = Clock(), Child(fail_starts=10)
    messages: list[str] = []
    policy = RestartPolicy(first_delay_s=1, max_restarts=3, window_s=60)
    supervisor = Supervisor(policy, say=messages.append, clock=clock)
    supervisor.add("PostgreSQL", child)
    child.alive = False
    with pytest.raises(CrashLoop, match=r"PostgreSQL .* could not be started"):
        for _ in range(10):
            supervisor.poll()
            state = supervisor.children[0].state
            assert state.restart_at is not None
            clock.now = state.restart_at
    assert any("could not be restarted: port taken" in m for m in messages), messages


def test_only_the_dead_child_is_restarted() -> None:
    clock = Clock()
    supervisor = Supervisor(RestartPolicy(), say=lambda _: None, clock=clock)
    api, worker = Child(), Child()
    supervisor.add("api", api)
    supervisor.add("worker", worker)
    worker.alive = False
    supervisor.poll()
    clock.now += 1
    supervisor.poll()
    assert (api.starts, worker.starts) == (0, 1)


def test_a_crash_loop_of_a_non_essential_child_marks_it_failing_and_retries_it() -> None:
    clock, child = Clock(), Child()
    messages: list[str] = []
    policy = RestartPolicy(first_delay_s=0.5, max_delay_s=10, max_restarts=3, window_s=60)
    supervisor = Supervisor(policy, say=messages.append, clock=clock)
    supervisor.add("api", Child())
    supervisor.add("worker", child, essential=False)
    restart_delays_of(supervisor, clock, child, 3, index=1)
    assert supervisor.failing() == {}
    # The fourth quick exit is a crash loop: no CrashLoop, the child is failing instead.
    delays = restart_delays_of(supervisor, clock, child, 3, index=1)
    # The reason follows the loop: exits in the window and the last status.
    assert supervisor.failing() == {"worker": "exited 6 times within 60s (last exit status -9)"}
    # ...and it is still retried, at the capped delay, for as long as it loops.
    assert delays == [10, 10, 10]
    assert any("worker is failing" in m and "keeps running" in m for m in messages), messages
    # Up for stable_after_s: it recovers, and its backoff starts over.
    clock.now += policy.stable_after_s
    supervisor.poll()
    assert supervisor.failing() == {}
    assert any("worker recovered" in m for m in messages), messages
    assert restart_delays_of(supervisor, clock, child, 1, index=1) == [0.5]


def test_a_non_essential_child_that_cannot_start_is_failing_too() -> None:
    clock, child = Clock(), Child(fail_starts=100)
    policy = RestartPolicy(first_delay_s=1, max_delay_s=5, max_restarts=3, window_s=60)
    supervisor = Supervisor(policy, say=lambda _: None, clock=clock)
    supervisor.add("nats-server", child, essential=False)
    child.alive = False
    for _ in range(10):
        supervisor.poll()
        state = supervisor.children[0].state
        assert state.restart_at is not None
        clock.now = state.restart_at
    assert "nats-server" in supervisor.failing()
    assert child.starts == 9


def restart_delays_of(
    supervisor: Supervisor, clock: Clock, child: Child, deaths: int, *, index: int
) -> list[float]:
    """restart_delays for the supervisor's child at `index`."""
    delays = []
    for _ in range(deaths):
        child.alive = False
        supervisor.poll()
        state = supervisor.children[index].state
        assert state.restart_at is not None
        delays.append(round(state.restart_at - clock.now, 3))
        clock.now = state.restart_at
        supervisor.poll()
        assert child.alive
    return delays
