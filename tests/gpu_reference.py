"""A sequential reference for GPU reconciliation: what applying complete or partial
inventory reports one after another must leave behind and emit."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class GpuReference:
    # uuid -> (index, missing)
    gpus: dict[str, tuple[int, bool]] = field(default_factory=dict)
    # (action, uuid) -> how often
    events: Counter[tuple[str, str]] = field(default_factory=Counter)

    def apply(self, reported: list[tuple[str, int]], complete: bool = True) -> None:
        for uuid, index in reported:
            known = self.gpus.get(uuid)
            if known is None:
                self.events["node.gpu.added", uuid] += 1
            else:
                if known[1]:
                    self.events["node.gpu.returned", uuid] += 1
                if known[0] != index:
                    self.events["node.gpu.changed", uuid] += 1
            self.gpus[uuid] = (index, False)
        if not complete:
            return
        listed = {uuid for uuid, _ in reported}
        for uuid, (index, missing) in list(self.gpus.items()):
            if uuid not in listed and not missing:
                self.gpus[uuid] = (index, True)
                self.events["node.gpu.missing", uuid] += 1
