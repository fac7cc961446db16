"""The scheduler's decision for one replica (issue 32): filter, fit, score, and a receipt
that says where it went and why, or why it could not go anywhere.

The caller (the service reconciler, workers/services.py) holds the service row's lock
and inserts the replica itself; `decide` only reads. Every node is counted once, by the
FIRST filter that ruled it out, in PlacementReason's order:

  node:    offline (recorded liveness not online: stale counts as offline), disabled,
           selector (`labels @> selector`), no_runtime (no runtime report),
           environment (the report lacks the template's binary, or lists none);
  device:  device_kind, device_busy (a live replica or a deployment not ended on it),
           insufficient_memory (reported free memory below the need plus headroom);
           a node is judged by its device that got furthest, one that reports no
           device counts as device_kind;
  node:    spread (this service's live replicas there reach max_per_node), backoff (a
           failed acquisition or load there, until its time), no_root (the node lacks
           the artifact and offers no artifact root to acquire it into).

A device with unknown free memory (its backend reports none) is not refused: it is
placed on with the lowest fit term, so a known fit wins over it. Decommissioned nodes
are not considered at all (they never return).

The feasible devices are scored (the highest wins; ties go to the lowest node id, then
device id, so the decision is deterministic):
  fit       free memory left after the need, relative to the device's total (0..1);
  artifact  the node holds a verified copy (no download): weighs more than any fit;
  evidence  a probe of the same artifact and profile on that device: its generation
            tokens/s relative to the best such probe (0..1);
  spread    1 / (1 + this service's replicas on the node).

The need is the template's estimate (store/services/estimate.py), replaced by the
largest figure a probe measured for the same artifact digest and profile (VRAM used on
a GPU, peak RSS on a CPU) when one exists, plus a headroom.

Speed (a decision over 10,000 nodes in well under 50 ms on two cores, measured by
ops/bench/service_placement.py): the fleet's slowly changing part (nodes' columns, their
runtime reports and artifact roots) comes from a snapshot (store/services/snapshot.py,
at most MAX_AGE_S old, reports parsed once per version). Every node is judged once per
snapshot for a given selector, device kind, environment and need, with the busy
devices and the evidence of that moment, and a new snapshot's judgment starts from the
previous one's (only nodes whose entry changed are judged again). What every placement
changes (busy devices, this service's replicas, the nodes holding the artifact, probe
evidence, backoff) is read fresh in one small statement, and only the nodes it names
or changes are judged again. The chosen node is read again on its current rows (a
change there takes a new snapshot first), and "unplaceable" is only answered from a
snapshot at most REFUSE_AGE_S old: a stale snapshot never places on a node that
changed, nor refuses for long; it can only miss, for its age, a node that became a
better choice.
"""

from __future__ import annotations

import heapq
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from sqlalchemy import String, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.ext.asyncio import AsyncSession

from schemas.artifacts import DigestAlgorithm
from schemas.deployments import ENDED_STATES
from schemas.protocol import StreamName
from schemas.runtime import LlamaSettings
from schemas.services import (
    MemoryEstimate,
    Placement,
    PlacementReason,
    PlacementReceipt,
    ReplicaPhase,
    ServiceTemplate,
)
from store.services import estimate as estimates
from store.services.snapshot import CACHE, FleetCache, NodeEntry, Report, Snapshot
from store.services.tables import Service

# The headroom over the estimate: a fraction of it, at least a floor (llama.cpp's own
# allocations vary by backend and version; a replica that does not fit fails its load).
HEADROOM_FRACTION: Final = 0.10
HEADROOM_FLOOR: Final = 256 * estimates.MiB

# Score weights: holding the artifact outweighs any difference of fit (0..1).
W_FIT: Final = 1.0
W_ARTIFACT: Final = 2.0
W_EVIDENCE: Final = 0.5
W_SPREAD: Final = 0.5

# The filters' order: a node is counted by the first that ruled it out.
ORDER: Final = tuple(PlacementReason)
_STAGE: Final = {reason: number for number, reason in enumerate(ORDER, start=1)}
_PASSED: Final = 99
OFFLINE, DISABLED, SELECTOR, NO_RUNTIME, ENVIRONMENT = (
    _STAGE[PlacementReason.OFFLINE],
    _STAGE[PlacementReason.DISABLED],
    _STAGE[PlacementReason.SELECTOR],
    _STAGE[PlacementReason.NO_RUNTIME],
    _STAGE[PlacementReason.ENVIRONMENT],
)
DEVICE_KIND, DEVICE_BUSY, MEMORY, SPREAD, BACKOFF, NO_ROOT = (
    _STAGE[PlacementReason.DEVICE_KIND],
    _STAGE[PlacementReason.DEVICE_BUSY],
    _STAGE[PlacementReason.INSUFFICIENT_MEMORY],
    _STAGE[PlacementReason.SPREAD],
    _STAGE[PlacementReason.BACKOFF],
    _STAGE[PlacementReason.NO_ROOT],
)

# What every placement changes, read fresh for each decision.
_FRESH: Final = text(
    """
WITH busy AS (
    SELECT node_id, device_id FROM service_replicas WHERE phase <> :ended_phase
    UNION
    SELECT node_id, device_id FROM deployments WHERE state <> ALL(:ended_states)
),
mine AS (
    SELECT node_id, count(*) AS replicas FROM service_replicas
    WHERE service_id = :service_id AND phase <> :ended_phase GROUP BY node_id
),
ev AS (
    SELECT node_id, device_id,
           max((evidence->>'generation_tokens_per_s')::float8) AS tps
    FROM runtime_evidence
    WHERE artifact_digest = :digest AND profile_id = :profile_id
    GROUP BY node_id, device_id
)
SELECT
    (SELECT array_agg(node_id) FROM busy) AS busy_nodes,
    (SELECT array_agg(device_id) FROM busy) AS busy_devices,
    (SELECT array_agg(node_id) FROM mine) AS mine_nodes,
    (SELECT array_agg(replicas) FROM mine) AS mine_counts,
    (SELECT array_agg(DISTINCT node_id) FROM node_artifacts
        WHERE repository = :repository AND "commit" = :commit AND files @> :file_match)
        AS held,
    (SELECT array_agg(node_id) FROM ev WHERE tps > 0) AS ev_nodes,
    (SELECT array_agg(device_id) FROM ev WHERE tps > 0) AS ev_devices,
    (SELECT array_agg(tps) FROM ev WHERE tps > 0) AS ev_tps,
    (SELECT binary_sha256 FROM runtime_environments WHERE id = :environment_id) AS binary,
    (SELECT max((evidence->>'vram_used_bytes')::bigint) FROM runtime_evidence
        WHERE artifact_digest = :digest AND profile_id = :profile_id) AS vram,
    (SELECT max((evidence->>'peak_rss_bytes')::bigint) FROM runtime_evidence
        WHERE artifact_digest = :digest AND profile_id = :profile_id) AS rss
"""
).bindparams(
    bindparam("ended_states", type_=ARRAY(String)),
    bindparam("service_id", type_=UUID(as_uuid=True)),
    bindparam("profile_id", type_=UUID(as_uuid=True)),
    bindparam("environment_id", type_=UUID(as_uuid=True)),
    bindparam("file_match", type_=JSONB),
)

# The chosen node, as it is now.
_CHOSEN: Final = text(
    """
SELECT nodes.liveness = 'online' AND nodes.enabled AND nodes.decommissioned_at IS NULL
        AND nodes.labels @> :selector AS schedulable,
    nodes.hostname, nodes.display_name,
    (SELECT coalesce(good_sequence, 0) FROM node_streams
        WHERE node_id = nodes.id AND stream = :runtime_stream AND good_payload IS NOT NULL)
        AS r_seq,
    (SELECT coalesce(good_sequence, 0) FROM node_streams
        WHERE node_id = nodes.id AND stream = :inventory_stream) AS i_seq
FROM nodes WHERE nodes.id = :node_id
"""
).bindparams(
    bindparam("node_id", type_=UUID(as_uuid=True)),
    bindparam("selector", type_=JSONB),
)


def headroom(need: int) -> int:
    return need + max(HEADROOM_FLOOR, int(need * HEADROOM_FRACTION))


def backed_off(backoff: Mapping[str, Any], now: datetime) -> set[uuid.UUID]:
    """The nodes this service avoids at `now` (service.backoff: node id → until)."""
    nodes: set[uuid.UUID] = set()
    for node_id, entry in backoff.items():
        try:
            until = datetime.fromisoformat(str((entry or {}).get("until")))
            if until > now:
                nodes.add(uuid.UUID(node_id))
        except (TypeError, ValueError, AttributeError):
            continue  # an entry we cannot read holds no node back
    return nodes


@dataclass(frozen=True)
class Need:
    """The bytes one replica needs on a GPU and on a CPU device (a probe may have
    measured either), each with the headroom, and where the figure came from."""

    gpu: int
    cpu: int
    estimate: MemoryEstimate


def need(template: ServiceTemplate, vram: int | None, rss: int | None) -> Need:
    """The template's estimate (or one from the file's size when it has none), refined by
    the largest figure measured by a probe of the same artifact digest and profile (VRAM
    on a GPU, peak RSS on a CPU)."""
    base = template.estimate
    if base is None:
        base = estimates.estimate(None, template.artifact.size_bytes, LlamaSettings())
    gpu = estimates.refine(base, vram)
    return Need(
        gpu=headroom(gpu.total_bytes),
        cpu=headroom(estimates.refine(base, rss).total_bytes),
        estimate=gpu,
    )


# ------------------------------------------------------------------ the decision


async def decide(
    session: AsyncSession, service: Service, now: datetime, cache: FleetCache | None = None
) -> PlacementReceipt:
    """Where the service's next replica goes, or why it goes nowhere: read only."""
    cache = CACHE if cache is None else cache
    template = ServiceTemplate.model_validate(service.template)
    placement = Placement.model_validate(service.placement)
    artifact = template.artifact
    fresh = (
        await session.execute(
            _FRESH,
            {
                "ended_phase": ReplicaPhase.ENDED.value,
                "ended_states": sorted(state.value for state in ENDED_STATES),
                "service_id": service.id,
                "environment_id": template.environment_id,
                "digest": artifact.sha256 or "",
                "profile_id": template.profile_id,
                "repository": artifact.repository,
                "commit": artifact.commit,
                "file_match": [
                    {"path": artifact.path, "digest": {"algorithm": DigestAlgorithm.SHA256}}
                ],
            },
        )
    ).one()
    measured = artifact.sha256 is not None
    needed = need(template, fresh.vram if measured else None, fresh.rss if measured else None)
    rules = _Rules(
        selector=dict(placement.selector),
        kind=placement.device_kind.value if placement.device_kind else None,
        # An environment nobody reported has no binary: no node matches it.
        binary=None if template.environment_id is None else (fresh.binary or "unknown"),
        need_gpu=needed.gpu,
        need_cpu=needed.cpu,
        max_per_node=placement.max_per_node,
        backoff=backed_off(service.backoff or {}, now),
        busy=_by_node(fresh.busy_nodes or [], fresh.busy_devices or []),
        mine=dict(zip(fresh.mine_nodes or [], fresh.mine_counts or [], strict=True)),
        held=set(fresh.held or []),
        evidence=_evidence(fresh.ev_nodes or [], fresh.ev_devices or [], fresh.ev_tps or []),
    )
    for retry in (False, True):
        snapshot = await cache.snapshot(session, force=retry)
        counts, best_free, winner = _decide_on(snapshot, rules)
        if winner is None:
            if not retry and time.monotonic() - snapshot.taken_at > cache.refuse_age_s:
                continue  # refuse only on a recent snapshot
            return receipt(now, counts, best_free, None, needed)
        chosen = (
            await session.execute(
                _CHOSEN,
                {
                    "node_id": winner["node_id"],
                    "selector": rules.selector,
                    "runtime_stream": StreamName.RUNTIME.value,
                    "inventory_stream": StreamName.INVENTORY.value,
                },
            )
        ).one_or_none()
        entry = snapshot.by_id[winner["node_id"]]
        unchanged = (
            chosen is not None
            and chosen.schedulable
            and chosen.r_seq == entry.runtime_version
            and chosen.i_seq == entry.inventory_version
        )
        if unchanged or retry:
            names = {"hostname": None, "display_name": None}
            if chosen is not None:
                names = {"hostname": chosen.hostname, "display_name": chosen.display_name}
            return receipt(now, counts, best_free, winner | names, needed)
    raise AssertionError("unreachable")


def _by_node(nodes: list[uuid.UUID], devices: list[str]) -> dict[uuid.UUID, frozenset[str]]:
    grouped: dict[uuid.UUID, set[str]] = {}
    for node, device in zip(nodes, devices, strict=True):
        grouped.setdefault(node, set()).add(device)
    return {node: frozenset(held) for node, held in grouped.items()}


def _evidence(
    nodes: list[uuid.UUID], devices: list[str], tps: list[float]
) -> dict[uuid.UUID, dict[str, float]]:
    """Each probed device's generation rate relative to the best (0..1], by node."""
    best = max(tps, default=0.0)
    grouped: dict[uuid.UUID, dict[str, float]] = {}
    for node, device, rate in zip(nodes, devices, tps, strict=True):
        grouped.setdefault(node, {})[device] = rate / best
    return grouped


@dataclass(frozen=True)
class _Rules:
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

    def static(self) -> _Rules:
        """What a snapshot's judgment of every node assumes: the devices busy and the
        evidence as now, none of the service's own replicas, backoff or artifact (the
        nodes those name, and those whose busy devices or evidence change later, are
        judged again at each decision)."""
        return _Rules(
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
    node: uuid.UUID, report: Report, rules: _Rules
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
        reached = _PASSED
        fit = 0.0 if free is None or not total else min(1.0, (free - need) / total)
        ev = rates.get(device_id, 0.0)
        choice = (W_FIT * fit + W_EVIDENCE * ev, device_id, fit, ev, free, need)
        if _better(choice, chosen):
            chosen = choice
    return reached, best_free, chosen


def _groups_fast(report: Report, rules: _Rules) -> tuple[int, int | None, Choice | None] | None:
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
                reached = _PASSED
                if _better(choice, chosen):
                    chosen = choice
        if group.unknown_id is not None:
            reached = _PASSED
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
    rules: _Rules,
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
    if reached != _PASSED or chosen is None:
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
    return Judgment(_PASSED, free, chosen, score, artifact, spread)


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


def _changed(static: _Static, rules: _Rules) -> set[uuid.UUID]:
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


def _static(snapshot: Snapshot, rules: _Rules) -> _Static:
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


def _judged(snapshot: Snapshot, base: _Rules) -> _Static:
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
    snapshot: Snapshot, inherited: _Static, base: _Rules, changed: set[uuid.UUID]
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


def _decide_on(
    snapshot: Snapshot, rules: _Rules
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


def receipt(
    now: datetime,
    counts: dict[int, int],
    best_free: int | None,
    winner: Mapping[str, Any] | None,
    needed: Need,
) -> PlacementReceipt:
    considered = sum(counts.values())
    feasible = counts.get(_PASSED, 0)
    rejected = {reason: counts[_STAGE[reason]] for reason in ORDER if counts.get(_STAGE[reason])}
    if winner is None:
        return PlacementReceipt(
            decided_at=now,
            outcome="unplaceable",
            nodes_considered=considered,
            feasible=feasible,
            rejected=rejected,
            needs_bytes=needed.gpu,
            best_free_bytes=best_free,
            message=_refusal(considered, rejected, needed, best_free)[:1000],
        )
    need = int(winner["need"])
    free = winner["free"]
    where = winner["display_name"] or winner["hostname"] or str(winner["node_id"])
    artifact = "holds the artifact" if winner["holds"] else "acquires the artifact first"
    after = (
        f"{estimates.gib(int(free) - need)} free after {estimates.gib(need)}"
        if free is not None
        else f"free memory not reported, needs {estimates.gib(need)}"
    )
    return PlacementReceipt(
        decided_at=now,
        outcome="placed",
        node_id=uuid.UUID(str(winner["node_id"])),
        device_id=str(winner["device_id"]),
        nodes_considered=considered,
        feasible=feasible,
        rejected=rejected,
        needs_bytes=need,
        best_free_bytes=best_free,
        score={term: float(winner[term]) for term in ("fit", "artifact", "evidence", "spread")},
        holds_artifact=bool(winner["holds"]),
        message=f"placed on {where} {winner['device_id']} ({feasible} of {considered} nodes"
        f" feasible): {artifact}, {after}"[:1000],
    )


def _refusal(
    considered: int,
    rejected: dict[PlacementReason, int],
    needed: Need,
    best_free: int | None,
) -> str:
    """Kubernetes's way: "0 of 10000 nodes: 9990 selector, 7 insufficient memory (needs
    5.1 GiB, best 4.0 GiB), 3 offline", the largest count first."""
    if considered == 0:
        return "0 of 0 nodes: no node is enrolled"
    parts = []
    ranked = sorted(rejected.items(), key=lambda item: (-item[1], ORDER.index(item[0])))
    for reason, count in ranked:
        part = f"{count} {reason.value.replace('_', ' ')}"
        if reason == PlacementReason.INSUFFICIENT_MEMORY:
            best = estimates.gib(best_free) if best_free is not None else "unknown"
            part += f" (needs {estimates.gib(needed.gpu)}, best {best})"
        parts.append(part)
    return f"0 of {considered} nodes: " + ", ".join(parts)
