"""Device selection, a pure function: the loaded device first, else free memory, then
the queue."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.runtime.selection import Candidate, choose_device

pytestmark = pytest.mark.fast


def c(device: str, loaded: str | None = None, pending: int = 0, free: int | None = 0) -> Candidate:
    return Candidate(device, loaded, pending, free)


def test_a_device_with_the_model_loaded_wins_over_free_memory() -> None:
    chosen = choose_device("m", [c("gpu:0", free=80), c("gpu:1", loaded="m", pending=1, free=1)])
    assert chosen.device_id == "gpu:1"


def test_among_loaded_devices_the_least_queued() -> None:
    chosen = choose_device("m", [c("gpu:0", "m", 2), c("gpu:1", "m", 0), c("gpu:2", "m", 1)])
    assert chosen.device_id == "gpu:1"


def test_otherwise_the_most_free_memory_then_the_shortest_queue() -> None:
    assert choose_device("m", [c("gpu:0", free=10), c("gpu:1", free=30)]).device_id == "gpu:1"
    tied = [c("gpu:0", pending=2, free=30), c("gpu:1", pending=1, free=30)]
    assert choose_device("m", tied).device_id == "gpu:1"
    assert choose_device("m", [c("gpu:0"), c("gpu:1")]).device_id == "gpu:0"


candidates = st.lists(
    st.builds(
        Candidate,
        st.uuids().map(str),
        st.sampled_from([None, "m", "other"]),
        st.integers(0, 5),
        st.one_of(st.none(), st.integers(0, 10**12)),
    ),
    min_size=1,
    max_size=8,
    unique_by=lambda x: x.device_id,
)


@given(candidates)
def test_the_choice_obeys_the_rules(devices: list[Candidate]) -> None:
    chosen = choose_device("m", devices)
    assert chosen in devices
    loaded = [d for d in devices if d.loaded_model == "m"]
    if loaded:
        assert chosen.loaded_model == "m"
        assert chosen.pending == min(d.pending for d in loaded)
    else:
        best = max(d.free_bytes or 0 for d in devices)
        assert (chosen.free_bytes or 0) == best
        assert chosen.pending == min(d.pending for d in devices if (d.free_bytes or 0) == best)
