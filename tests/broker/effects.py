"""An append-only effect log shared by test actors in any number of processes.

One line per effect, "<kind> <key> <pid> <unix time>", written with a single O_APPEND write (atomic
for lines this short), so workers in several processes can log without locking.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Effect:
    kind: str
    key: str
    pid: int
    at: float


class EffectLog:
    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, kind: str, key: str) -> None:
        line = f"{kind} {key} {os.getpid()} {time.time():.6f}\n".encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def read(self) -> list[Effect]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        effects = []
        for line in text.splitlines():
            kind, key, pid, at = line.split(" ")
            effects.append(Effect(kind, key, int(pid), float(at)))
        return effects

    def of(self, kind: str) -> list[Effect]:
        return [e for e in self.read() if e.kind == kind]

    def counts(self, kind: str) -> Counter[str]:
        return Counter(e.key for e in self.of(kind))

    def wait_for(self, predicate, timeout_s: float, what: str) -> list[Effect]:
        """Poll until predicate(effects) is true; fail the test after timeout_s."""
        deadline = time.monotonic() + timeout_s
        while True:
            effects = self.read()
            if predicate(effects):
                return effects
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s}s waiting for {what}: {effects}")
            time.sleep(0.05)
