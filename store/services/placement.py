"""The scheduler's decision for one replica (issue 32): filter, fit, score, and a receipt
that says where it went and why, or why it could not go anywhere.

The caller (the service reconciler, workers/services.py) holds the service row's lock
and inserts the replica itself; `decide` only reads. One statement does the work over
the whole fleet, in PostgreSQL: every node is counted once, by the FIRST filter that
ruled it out, in PlacementReason's order:

  node:    offline (recorded liveness not online: stale counts as offline), disabled,
           selector (`labels @> selector`, the GIN index), no_runtime (no runtime report),
           environment (the report lacks the template's binary, or lists none);
  device:  device_kind, device_busy (a live replica or a deployment not ended on it),
           insufficient_memory (reported free memory below the need plus headroom);
           a node is judged by its device that got furthest;
  node:    spread (this service's live replicas there reach max_per_node), backoff (a
           failed acquisition or load there, until its time), no_root (the node lacks
           the artifact and offers no artifact root to acquire it into).

A device with unknown free memory (its backend reports none) is not refused: it is
placed on with the lowest fit term, so a known fit wins over it.

The feasible devices are scored in the same statement (the highest wins; ties go to the
lowest node id, then device id, so the decision is deterministic):
  fit       free memory left after the need, relative to the device's total (0..1);
  artifact  the node holds a verified copy (no download): weighs more than any fit;
  evidence  a probe of the same artifact and profile on that device: its generation
            tokens/s relative to the best such probe (0..1);
  spread    1 / (1 + this service's replicas on the node).

The need is the template's estimate (store/services/estimate.py), replaced by the
largest figure a probe measured for the same artifact digest and profile (VRAM used on
a GPU, peak RSS on a CPU) when one exists, plus a headroom.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from sqlalchemy import BigInteger, String, bindparam, select, text
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
from store.runtime_tables import RuntimeEnvironment
from store.services import estimate as estimates
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


def _stage(reason: PlacementReason) -> int:
    return _STAGE[reason]


_DECIDE: Final = text(
    f"""
WITH busy AS (
    SELECT node_id, device_id FROM service_replicas WHERE phase <> :ended_phase
    UNION
    SELECT node_id, device_id FROM deployments WHERE state <> ALL(:ended_states)
),
mine AS (
    SELECT node_id, count(*) AS replicas FROM service_replicas
    WHERE service_id = :service_id AND phase <> :ended_phase GROUP BY node_id
),
held AS (
    SELECT DISTINCT node_id FROM node_artifacts
    WHERE repository = :repository AND "commit" = :commit AND files @> :file_match
),
ev AS (
    SELECT node_id, device_id,
           max((evidence->>'generation_tokens_per_s')::float8) AS tps
    FROM runtime_evidence
    WHERE artifact_digest = :digest AND profile_id = :profile_id
    GROUP BY node_id, device_id
),
n AS MATERIALIZED (
    SELECT nodes.id AS node_id,
        CASE
            WHEN nodes.liveness <> 'online' THEN {_stage(PlacementReason.OFFLINE)}
            WHEN NOT nodes.enabled THEN {_stage(PlacementReason.DISABLED)}
            WHEN NOT nodes.labels @> :selector THEN {_stage(PlacementReason.SELECTOR)}
            WHEN rt.good_payload IS NULL THEN {_stage(PlacementReason.NO_RUNTIME)}
            WHEN jsonb_typeof(rt.good_payload->'environments') IS DISTINCT FROM 'array'
                OR rt.good_payload->'environments' = '[]'::jsonb
                OR NOT rt.good_payload->'environments' @> :environment_match
                THEN {_stage(PlacementReason.ENVIRONMENT)}
            ELSE {_PASSED}
        END AS stage,
        rt.good_payload->'devices' AS devices
    FROM nodes
    LEFT JOIN node_streams rt ON rt.node_id = nodes.id AND rt.stream = :runtime_stream
    WHERE nodes.decommissioned_at IS NULL
),
d AS (
    SELECT n.node_id, dev->>'device_id' AS device_id, dev->>'backend' AS backend,
        (dev->>'memory_free_bytes')::bigint AS free,
        (dev->>'memory_total_bytes')::bigint AS total
    FROM n CROSS JOIN LATERAL jsonb_array_elements(
        CASE WHEN jsonb_typeof(n.devices) = 'array' THEN n.devices ELSE '[]'::jsonb END
    ) AS dev
    WHERE n.stage = {_PASSED}
),
dd AS MATERIALIZED (
    SELECT d.*,
        CASE WHEN d.backend = 'cpu' THEN :need_cpu ELSE :need_gpu END AS need,
        CASE
            WHEN CAST(:device_kind AS text) IS NOT NULL
                AND d.backend IS DISTINCT FROM CAST(:device_kind AS text)
                THEN {_stage(PlacementReason.DEVICE_KIND)}
            WHEN b.node_id IS NOT NULL THEN {_stage(PlacementReason.DEVICE_BUSY)}
            WHEN d.free < (CASE WHEN d.backend = 'cpu' THEN :need_cpu ELSE :need_gpu END)
                THEN {_stage(PlacementReason.INSUFFICIENT_MEMORY)}
            ELSE {_PASSED}
        END AS stage
    FROM d LEFT JOIN busy b ON b.node_id = d.node_id AND b.device_id = d.device_id
),
dn AS (SELECT node_id, max(stage) AS stage FROM dd GROUP BY node_id),
final AS MATERIALIZED (
    SELECT n.node_id,
        CASE
            WHEN n.stage <> {_PASSED} THEN n.stage
            WHEN dn.stage IS NULL THEN {_stage(PlacementReason.DEVICE_KIND)}
            WHEN dn.stage <> {_PASSED} THEN dn.stage
            WHEN coalesce(m.replicas, 0) >= :max_per_node THEN {_stage(PlacementReason.SPREAD)}
            WHEN n.node_id = ANY(:backoff) THEN {_stage(PlacementReason.BACKOFF)}
            WHEN h.node_id IS NULL AND NOT coalesce(
                jsonb_typeof(inv.good_payload->'host'->'artifact_roots') = 'array'
                AND inv.good_payload->'host'->'artifact_roots' <> '[]'::jsonb, false)
                THEN {_stage(PlacementReason.NO_ROOT)}
            ELSE {_PASSED}
        END AS stage,
        h.node_id IS NOT NULL AS holds,
        coalesce(m.replicas, 0) AS replicas
    FROM n
    LEFT JOIN dn ON dn.node_id = n.node_id
    LEFT JOIN mine m ON m.node_id = n.node_id
    LEFT JOIN held h ON h.node_id = n.node_id
    LEFT JOIN node_streams inv
        ON inv.node_id = n.node_id AND inv.stream = :inventory_stream
        AND n.stage = {_PASSED}
),
cand AS (
    SELECT dd.node_id, dd.device_id, dd.free, dd.need, f.holds,
        CASE WHEN dd.free IS NULL OR coalesce(dd.total, 0) <= 0 THEN 0.0
            ELSE greatest(0.0, least(1.0, (dd.free - dd.need)::float8 / dd.total))
        END AS fit,
        CASE WHEN f.holds THEN 1.0 ELSE 0.0 END AS artifact,
        coalesce(ev.tps / nullif((SELECT max(tps) FROM ev), 0), 0.0) AS evidence,
        1.0 / (1 + f.replicas) AS spread
    FROM dd
    JOIN final f ON f.node_id = dd.node_id
    LEFT JOIN ev ON ev.node_id = dd.node_id AND ev.device_id = dd.device_id
    WHERE f.stage = {_PASSED} AND dd.stage = {_PASSED}
)
SELECT
    (SELECT coalesce(jsonb_object_agg(stage, c), '{{}}'::jsonb)
        FROM (SELECT stage, count(*) AS c FROM final GROUP BY stage) AS x) AS counts,
    (SELECT max(free) FROM dd WHERE stage >= {_stage(PlacementReason.INSUFFICIENT_MEMORY)})
        AS best_free,
    (SELECT to_jsonb(w) FROM (
        SELECT c.node_id, c.device_id, c.free, c.need, c.holds,
            c.fit, c.artifact, c.evidence, c.spread,
            nodes.hostname, nodes.display_name,
            {W_FIT} * c.fit + {W_ARTIFACT} * c.artifact
                + {W_EVIDENCE} * c.evidence + {W_SPREAD} * c.spread AS score
        FROM cand c JOIN nodes ON nodes.id = c.node_id
        ORDER BY score DESC, c.node_id, c.device_id
        LIMIT 1
    ) AS w) AS winner
"""  # noqa: S608 (only this module's constants are formatted in; values are bound)
).bindparams(
    bindparam("ended_states", type_=ARRAY(String)),
    bindparam("backoff", type_=ARRAY(UUID(as_uuid=True))),
    bindparam("service_id", type_=UUID(as_uuid=True)),
    bindparam("profile_id", type_=UUID(as_uuid=True)),
    bindparam("selector", type_=JSONB),
    bindparam("file_match", type_=JSONB),
    bindparam("environment_match", type_=JSONB),
    bindparam("need_cpu", type_=BigInteger),
    bindparam("need_gpu", type_=BigInteger),
)


def headroom(need: int) -> int:
    return need + max(HEADROOM_FLOOR, int(need * HEADROOM_FRACTION))


def backed_off(backoff: Mapping[str, Any], now: datetime) -> list[uuid.UUID]:
    """The nodes this service avoids at `now` (service.backoff: node id → until)."""
    nodes: list[uuid.UUID] = []
    for node_id, entry in backoff.items():
        try:
            until = datetime.fromisoformat(str((entry or {}).get("until")))
            if until > now:
                nodes.append(uuid.UUID(node_id))
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


async def need(session: AsyncSession, template: ServiceTemplate) -> Need:
    """The template's estimate (or one from the file's size when it has none), refined by
    the largest figure measured by a probe of the same artifact digest and profile."""
    base = template.estimate
    if base is None:
        base = estimates.estimate(None, template.artifact.size_bytes, LlamaSettings())
    vram = rss = None
    if template.artifact.sha256 is not None:
        row = (
            await session.execute(
                text(
                    "SELECT max((evidence->>'vram_used_bytes')::bigint),"
                    " max((evidence->>'peak_rss_bytes')::bigint) FROM runtime_evidence"
                    " WHERE artifact_digest = :digest AND profile_id = :profile_id"
                ).bindparams(bindparam("profile_id", type_=UUID(as_uuid=True))),
                {"digest": template.artifact.sha256, "profile_id": template.profile_id},
            )
        ).one()
        vram, rss = row
    gpu = estimates.refine(base, vram)
    return Need(
        gpu=headroom(gpu.total_bytes),
        cpu=headroom(estimates.refine(base, rss).total_bytes),
        estimate=gpu,
    )


async def _environment_match(session: AsyncSession, environment_id: uuid.UUID | None) -> Any:
    """What a node's report must contain: the environment's binary, or (None) anything;
    an unknown environment matches no node (a digest no binary has)."""
    if environment_id is None:
        return []
    binary = (
        await session.execute(
            select(RuntimeEnvironment.binary_sha256).where(RuntimeEnvironment.id == environment_id)
        )
    ).scalar_one_or_none()
    return [{"binary_sha256": binary or "unknown"}]


async def decide(session: AsyncSession, service: Service, now: datetime) -> PlacementReceipt:
    """Where the service's next replica goes, or why it goes nowhere: read only."""
    template = ServiceTemplate.model_validate(service.template)
    placement = Placement.model_validate(service.placement)
    needed = await need(session, template)
    artifact = template.artifact
    params = {
        "ended_phase": ReplicaPhase.ENDED.value,
        "ended_states": sorted(state.value for state in ENDED_STATES),
        "service_id": service.id,
        "repository": artifact.repository,
        "commit": artifact.commit,
        "file_match": [{"path": artifact.path, "digest": {"algorithm": DigestAlgorithm.SHA256}}],
        "digest": artifact.sha256 or "",
        "profile_id": template.profile_id,
        "selector": dict(placement.selector),
        "environment_match": await _environment_match(session, template.environment_id),
        "runtime_stream": StreamName.RUNTIME.value,
        "inventory_stream": StreamName.INVENTORY.value,
        "device_kind": placement.device_kind.value if placement.device_kind else None,
        "need_cpu": needed.cpu,
        "need_gpu": needed.gpu,
        "max_per_node": placement.max_per_node,
        "backoff": backed_off(service.backoff or {}, now),
    }
    row = (await session.execute(_DECIDE, params)).one()
    counts = _counts(row.counts)
    return receipt(now, counts, row.best_free, row.winner, needed)


def _counts(raw: Any) -> dict[int, int]:
    values = json.loads(raw) if isinstance(raw, str) else (raw or {})
    return {int(stage): int(count) for stage, count in values.items()}


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
