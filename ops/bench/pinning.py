"""Give the model server a core of its own, in both of a bench's rounds.

In production the gateway (API, PostgreSQL, NATS) and the node (agent, runtime worker,
llama-server on its GPU) are different machines, and the client is a third. On a
2-core bench box they all share two cores: a CPU llama-server computing beside the API
and the runtime worker is slowed by them, and the figure then says "two processes
shared a core", not what the gateway's path adds. Pinned, the bench and everything it
starts (the stack, the runtime worker, the load generator) run on all cores but the
last, and each llama-server, the deployment's and the direct baseline alike, on the
last core alone. Both rounds keep the same llama-server conditions; only one round runs
at a time, so the two servers never compute at once.

Linux only (sched_setaffinity); a box with one core cannot pin and says so.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Cores:
    rest: frozenset[int]
    model: frozenset[int]

    def describe(self) -> str:
        return (
            f"pinned: llama-server on core {sorted(self.model)}, the stack, node processes "
            f"and load generator on cores {sorted(self.rest)}"
        )


def split() -> Cores:
    """Pin this process (and so all it starts from now) to every core but the last."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("pinning needs two cores; run with --no-pin")
    split_cores = Cores(rest=frozenset(cores[:-1]), model=frozenset(cores[-1:]))
    os.sched_setaffinity(0, split_cores.rest)
    return split_cores


def pin_process(pid: int, cores: frozenset[int]) -> int:
    """Every thread of `pid` onto `cores` (affinity is per thread; the threads a pinned
    thread starts later inherit it). Returns how many threads were pinned."""
    pinned = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        # A thread may end between the listing and the call.
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(task.name), cores)
            pinned += 1
    if pinned == 0:
        raise SystemExit(f"no thread of process {pid} to pin")
    return pinned
