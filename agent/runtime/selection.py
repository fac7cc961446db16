"""Which device serves a request: a pure function, so its rules are tested on their own.

A device that already has the model loaded wins (the least queued of them); otherwise
the one with the most free memory, then the shortest queue, then the first configured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Candidate:
    device_id: str
    loaded_model: str | None
    pending: int
    free_bytes: int | None


def choose_device(model_id: str, candidates: Sequence[Candidate]) -> Candidate:
    if not candidates:
        raise ValueError("no device to choose from")
    loaded = [c for c in candidates if c.loaded_model == model_id]
    if loaded:
        return min(loaded, key=lambda c: c.pending)
    order = {c.device_id: i for i, c in enumerate(candidates)}
    return min(candidates, key=lambda c: (-(c.free_bytes or 0), c.pending, order[c.device_id]))
