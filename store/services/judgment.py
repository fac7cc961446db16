"""The scheduler's judgment of nodes (store/services/placement.py decides with it):
each node through the filters in PlacementReason's order, its best device and its
score, for a whole snapshot at once (store/services/snapshot.py) and then again for the
few nodes a decision's fresh reads name.

A snapshot's judgment assumes the busy devices and the evidence of its making and none
of the service's own replicas, artifact holders or backoff; a decision judges again the
nodes whose busy devices or evidence changed since, and the nodes those sets name. A
new snapshot's judgment starts from the previous one's: only nodes whose entry changed
are judged again, and the lists of the best (TOP of them) are merged, keeping only what
is provably still on top.
"""

from __future__ import annotations

import heapq
import uuid
from dataclasses import dataclass, field
from typing import Any, Final

from schemas.services import PlacementReason
from store.services.snapshot import NodeEntry, Report, Snapshot

# Score weights: holding the artifact outweighs any difference of fit (0..1).
W_FIT: Final = 1.0
W_ARTIFACT: Final = 2.0
W_EVIDENCE: Final = 0.5
W_SPREAD: Final = 0.5

# The filters' order: a node is counted by the first that ruled it out.
ORDER: Final = tuple(PlacementReason)
STAGE: Final = {reason: number for number, reason in enumerate(ORDER, start=1)}
PASSED: Final = 99
OFFLINE, DISABLED, SELECTOR, NO_RUNTIME, ENVIRONMENT = (
    STAGE[PlacementReason.OFFLINE],
    STAGE[PlacementReason.DISABLED],
    STAGE[PlacementReason.SELECTOR],
    STAGE[PlacementReason.NO_RUNTIME],
    STAGE[PlacementReason.ENVIRONMENT],
)
DEVICE_KIND, DEVICE_BUSY, MEMORY, SPREAD, BACKOFF, NO_ROOT = (
    STAGE[PlacementReason.DEVICE_KIND],
    STAGE[PlacementReason.DEVICE_BUSY],
    STAGE[PlacementReason.INSUFFICIENT_MEMORY],
    STAGE[PlacementReason.SPREAD],
    STAGE[PlacementReason.BACKOFF],
    STAGE[PlacementReason.NO_ROOT],
)


@dataclass(frozen=True)
class Rules:
    selector: dict[str, str]
    kind: str | None
    binary: str | None
    need_gpu: int
    need_cpu: int
    max_per_node: int
    backoff: set[uuid.UUID]
    # Busy devices, and probed devices' relative rates, by node.
    busy: dict[uuid.UUID, frozenset[str]]
    mine: dict[uuid.UUID, int]
    held: set[uuid.UUID]
    evidence: dict[uuid.UUID, dict[str, float]]

    def static(self) -> Rules:
        """What a snapshot's judgment of every node assumes: the devices busy and the
        evidence as now, none of the service's own replicas, backoff or artifact (the
        nodes those name, and those whose busy devices or evidence change later, are
        judged again at each decision)."""
        return Rules(
            self.selector,
            self.kind,
            self.binary,
            self.need_gpu,
            self.need_cpu,
            self.max_per_node,
            set(),
            self.busy,
            {},
            set(),
            self.evidence,
        )

    def key(self) -> tuple[Any, ...]:
        return (
            tuple(sorted(self.selector.items())),
            self.kind,
            self.binary,
            self.need_gpu,
            self.need_cpu,
            self.max_per_node,
        )


# A node's best device: (fit + evidence part, device id, fit, evidence, free, need).
Choice = tuple[float, str, float, float, int | None, int]


def _better(a: Choice, b: Choice | None) -> bool:
    return b is None or a[0] > b[0] or (a[0] == b[0] and a[1] < b[1])


def _devices(
    node: uuid.UUID, report: Report, rules: Rules
) -> tuple[int, int | None, Choice | None]:
    """Every device of the node through the device filters: the furthest stage one
    reached, the most free memory among those that reached the memory filter, and the
    best that passed."""
    reached, best_free, chosen = DEVICE_KIND, None, None
    busy = rules.busy.get(node, frozenset())
    rates = rules.evidence.get(node, {})
    for device_id, backend, free, total in report.devices:
        if rules.kind is not None and backend != rules.kind:
            continue
        if device_id in busy:
            reached = max(reached, DEVICE_BUSY)
            continue
        if free is not None and (best_free is None or free > best_free):
            best_free = free
        need = rules.need_cpu if backend == "cpu" else rules.need_gpu
        if free is not None and free < need:
            reached = max(reached, MEMORY)
            continue
        reached = PASSED
        fit = 0.0 if free is None or not total else min(1.0, (free - need) / total)
        ev = rates.get(device_id, 0.0)
        choice = (W_FIT * fit + W_EVIDENCE * ev, device_id, fit, ev, free, need)
        if _better(choice, chosen):
            chosen = choice
    return reached, best_free, chosen


def _groups_fast(report: Report, rules: Rules) -> tuple[int, int | None, Choice | None] | None:
    """`_devices` from the report's per-backend summary, for a node with no busy device
    and no evidence; None when a group is not uniform (then every device is looked at)."""
    reached, best_free, chosen = DEVICE_KIND, None, None
    groups = report.groups
    for backend in groups if rules.kind is None else (rules.kind,):
        group = groups.get(backend)
        if group is None:
            continue
        if not group.uniform:
            return None
        need = rules.need_cpu if backend == "cpu" else rules.need_gpu
        reached = max(reached, MEMORY)
        free = group.max_free
        if free is not None:
            if best_free is None or free > best_free:
                best_free = free
            if free >= need:
                total = group.best_total
                fit = 0.0 if not total else min(1.0, (free - need) / total)
                choice: Choice = (W_FIT * fit, group.best_id, fit, 0.0, free, need)
                reached = PASSED
                if _better(choice, chosen):
                    chosen = choice
        if group.unknown_id is not None:
            reached = PASSED
            unknown: Choice = (0.0, group.unknown_id, 0.0, 0.0, None, need)
            if _better(unknown, chosen):
                chosen = unknown
    return reached, best_free, chosen


@dataclass(frozen=True)
class Judgment:
    stage: int
    # The most free memory on a device that reached the memory filter.
    free: int | None
    choice: Choice | None = None
    score: float = 0.0
    artifact: float = 0.0
    spread: float = 0.0


# A node's device filters' outcome: (furthest stage, most free memory, best device).
Devices = tuple[int, int | None, Choice | None]


def judge(
    entry: NodeEntry,
    rules: Rules,
    memo: dict[uuid.UUID, tuple[NodeEntry, Any, Devices]] | None = None,
) -> Judgment:
    """One node through every filter, in PlacementReason's order, and its score. `memo`
    keeps the device filters' outcome by node, for the same entry, busy devices and
    evidence (a busy node is judged again at every decision; its devices rarely change)."""
    if not entry.online:
        return Judgment(OFFLINE, None)
    if not entry.enabled:
        return Judgment(DISABLED, None)
    labels = entry.labels
    for key, value in rules.selector.items():
        if labels.get(key) != value:
            return Judgment(SELECTOR, None)
    report = entry.report
    if report is None:
        return Judgment(NO_RUNTIME, None)
    envs = report.environments
    if not envs or (rules.binary is not None and rules.binary not in envs):
        return Judgment(ENVIRONMENT, None)
    node = entry.node_id
    named = (rules.busy.get(node), rules.evidence.get(node))
    held = memo.get(node) if memo is not None else None
    if held is not None and held[0] is entry and held[1] == named:
        reached, free, chosen = held[2]
    else:
        fast = _groups_fast(report, rules) if named == (None, None) else None
        reached, free, chosen = fast if fast is not None else _devices(node, report, rules)
        if memo is not None:
            memo[node] = (entry, named, (reached, free, chosen))
    if reached != PASSED or chosen is None:
        return Judgment(reached, free)
    replicas = rules.mine.get(node, 0)
    holds = node in rules.held
    if replicas >= rules.max_per_node:
        return Judgment(SPREAD, free)
    if node in rules.backoff:
        return Judgment(BACKOFF, free)
    if not holds and not entry.has_roots:
        return Judgment(NO_ROOT, free)
    artifact = 1.0 if holds else 0.0
    spread = 1.0 / (1 + replicas)
    score = chosen[0] + W_ARTIFACT * artifact + W_SPREAD * spread
    return Judgment(PASSED, free, chosen, score, artifact, spread)


@dataclass(frozen=True)
class _Static:
    """Every node of a snapshot judged as if nothing ran on the fleet (by entry: an entry
    the next snapshot reuses keeps its judgment)."""

    counts: dict[int, int]
    judged: dict[uuid.UUID, tuple[NodeEntry, Judgment]]
    # The TOP nodes by free memory, and the TOP feasible by score (then node, device),
    # as ascending keys; the fresh sets rarely name that many of them (then every node
    # is looked at).
    by_free: list[FreeKey]
    by_score: list[ScoreKey]
    # The busy devices and evidence it was judged with.
    busy: dict[uuid.UUID, frozenset[str]]
    evidence: dict[uuid.UUID, dict[str, float]]
    # The device filters' outcomes by node (judge's memo).
    devices: dict[uuid.UUID, tuple[NodeEntry, Any, Devices]] = field(default_factory=dict)


def _changed(static: _Static, rules: Rules) -> set[uuid.UUID]:
    """The nodes whose busy devices or evidence differ from the static judgment's."""
    changed = {
        node
        for node in static.busy.keys() | rules.busy.keys()
        if static.busy.get(node) != rules.busy.get(node)
    }
    if static.evidence or rules.evidence:
        changed |= {
            node
            for node in static.evidence.keys() | rules.evidence.keys()
            if static.evidence.get(node) != rules.evidence.get(node)
        }
    return changed


# Judgments kept per snapshot (one per selector, kind, environment and need), and how
# many of the best it keeps in order.
MAX_MEMO: Final = 64
TOP: Final = 64


FreeKey = tuple[int, uuid.UUID]  # (-free, node)
ScoreKey = tuple[float, uuid.UUID, str]  # (-score, node, device)


def _free_key(node: uuid.UUID, judgment: Judgment) -> FreeKey | None:
    return None if judgment.free is None else (-judgment.free, node)


def _score_key(node: uuid.UUID, judgment: Judgment) -> ScoreKey | None:
    if judgment.choice is None:
        return None
    return (-judgment.score, node, judgment.choice[1])


def _static(snapshot: Snapshot, rules: Rules) -> _Static:
    """Every node judged for these rules, once per snapshot: from the previous snapshot's
    judgment when there is one (only the nodes whose entry, busy devices or evidence
    changed are judged again), else from scratch."""
    key = rules.key()
    held = snapshot.memo.get(key)
    if isinstance(held, _Static):
        return held
    inherited = snapshot.inherited.get(key)
    base = rules.static()
    if isinstance(inherited, _Static) and snapshot.changed is not None:
        made = _updated(snapshot, inherited, base, snapshot.changed | _changed(inherited, base))
    else:
        made = _judged(snapshot, base)
    if len(snapshot.memo) >= MAX_MEMO:
        snapshot.memo.clear()
    snapshot.memo[key] = made
    return made


def _judged(snapshot: Snapshot, base: Rules) -> _Static:
    counts: dict[int, int] = {}
    judged: dict[uuid.UUID, tuple[NodeEntry, Judgment]] = {}
    devices: dict[uuid.UUID, tuple[NodeEntry, Any, Devices]] = {}
    for entry in snapshot.nodes:
        judgment = judge(entry, base, devices)
        judged[entry.node_id] = (entry, judgment)
        counts[judgment.stage] = counts.get(judgment.stage, 0) + 1
    by_free, by_score = _tops(judged, TOP)
    return _Static(counts, judged, by_free, by_score, base.busy, base.evidence, devices)


def _updated(
    snapshot: Snapshot, inherited: _Static, base: Rules, changed: set[uuid.UUID]
) -> _Static:
    """The inherited judgment with the changed nodes judged again (and the removed gone):
    the top lists keep what stays correct of them (see _merge)."""
    counts = dict(inherited.counts)
    judged = dict(inherited.judged)
    devices = dict(inherited.devices)
    frees: list[FreeKey] = []
    scores: list[ScoreKey] = []
    for node in changed:
        old = judged.pop(node, None)
        if old is not None:
            counts[old[1].stage] -= 1
        entry = snapshot.by_id.get(node)
        if entry is None:
            continue
        judgment = judge(entry, base, devices)
        judged[node] = (entry, judgment)
        counts[judgment.stage] = counts.get(judgment.stage, 0) + 1
        if (free := _free_key(node, judgment)) is not None:
            frees.append(free)
        if (score := _score_key(node, judgment)) is not None:
            scores.append(score)
    by_free = _merge(inherited.by_free, frees, changed)
    by_score = _merge(inherited.by_score, scores, changed)
    if len(by_free) < TOP // 2 or len(by_score) < TOP // 2:
        by_free, by_score = _tops(judged, TOP)
    counts = {stage: count for stage, count in counts.items() if count}
    return _Static(counts, judged, by_free, by_score, base.busy, base.evidence, devices)


def _merge(top: list[Any], fresh: list[Any], changed: set[uuid.UUID]) -> list[Any]:
    """A top list (ascending keys) with the changed nodes' old keys taken out and their
    new ones merged in. What remains of a full list is the top of the unchanged nodes,
    so a new key after its last could be beaten by an unchanged node outside it: those
    are left out. A list shorter than TOP held every node: nothing is left out."""
    complete = len(top) < TOP
    remaining = [item for item in top if item[1] not in changed]
    merged = sorted(remaining + fresh)
    if not complete and remaining:
        merged = [item for item in merged if item <= remaining[-1]]
    elif not complete:
        merged = []
    return merged[:TOP]


def _tops(
    judged: dict[uuid.UUID, tuple[NodeEntry, Judgment]], count: int | None
) -> tuple[list[FreeKey], list[ScoreKey]]:
    """The keys of the nodes with the most free memory and of the best feasible ones,
    ascending, `count` of each (None: all)."""
    frees = [k for node, (_, j) in judged.items() if (k := _free_key(node, j)) is not None]
    scores = [s for node, (_, j) in judged.items() if (s := _score_key(node, j)) is not None]
    if count is None:
        return sorted(frees), sorted(scores)
    return heapq.nsmallest(count, frees), heapq.nsmallest(count, scores)


def decide_on(
    snapshot: Snapshot, rules: Rules
) -> tuple[dict[int, int], int | None, dict[str, Any] | None]:
    """The counts by stage, the most free memory that reached the memory filter, and the
    winner: the snapshot's judgment, with the nodes the fresh sets name judged again."""
    static = _static(snapshot, rules)
    named = _changed(static, rules) | rules.mine.keys() | rules.held | rules.backoff
    special = [node for node in named if node in snapshot.by_id]
    counts = dict(static.counts)
    best_free: int | None = None
    best: tuple[float, uuid.UUID, Judgment] | None = None
    for node in special:
        entry, before = static.judged[node]
        counts[before.stage] -= 1
        now = judge(entry, rules, static.devices)
        counts[now.stage] = counts.get(now.stage, 0) + 1
        if now.free is not None and (best_free is None or now.free > best_free):
            best_free = now.free
        if now.choice is not None and _wins(now.score, node, now, best):
            best = (now.score, node, now)
    skip = set(special)
    by_free, by_score = static.by_free, static.by_score
    if len(skip) >= TOP // 2 and (
        all(key[1] in skip for key in by_free) or all(key[1] in skip for key in by_score)
    ):
        by_free, by_score = _tops(static.judged, None)
    for free_key in by_free:
        if free_key[1] not in skip:
            free = -free_key[0]
            best_free = free if best_free is None else max(best_free, free)
            break
    for score_key in by_score:
        node = score_key[1]
        if node not in skip:
            judgment = static.judged[node][1]
            if _wins(judgment.score, node, judgment, best):
                best = (judgment.score, node, judgment)
            break
    counts = {stage: count for stage, count in counts.items() if count}
    if best is None:
        return counts, best_free, None
    _, node, judgment = best
    assert judgment.choice is not None
    _, device_id, fit, ev, device_free, need = judgment.choice
    return (
        counts,
        best_free,
        {
            "node_id": node,
            "device_id": device_id,
            "free": device_free,
            "need": need,
            "holds": judgment.artifact == 1.0,
            "fit": fit,
            "artifact": judgment.artifact,
            "evidence": ev,
            "spread": judgment.spread,
        },
    )


def _wins(
    score: float,
    node: uuid.UUID,
    judgment: Judgment,
    best: tuple[float, uuid.UUID, Judgment] | None,
) -> bool:
    if best is None or score > best[0]:
        return True
    if score < best[0]:
        return False
    mine = (node, judgment.choice[1] if judgment.choice else "")
    theirs = (best[1], best[2].choice[1] if best[2].choice else "")
    return mine < theirs
