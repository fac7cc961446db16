"""The fleet as the scheduler reads it (store/services/placement.py): each node's
columns (liveness, enablement, labels) and the parts of its runtime report and
inventory a placement needs, parsed once per report version.

Kubernetes's scheduler decides from an informer cache, not from the API server on
every pod; this is the same idea on PostgreSQL. A snapshot is read in one statement
(one scan of nodes and of node_streams' two streams, no JSON but the labels) and the
reports that changed since the last one are fetched and parsed; it serves decisions for
`max_age_s`. What changes with every placement (busy devices, a service's replicas) is
never taken from it: placement.py reads those fresh, checks the chosen node again, and
answers "unplaceable" only from a snapshot at most `refuse_age_s` old.

A stream's good_sequence only grows (store/ordering.py: a sample at or below the cursor
is a replay), so it names a report exactly: a parse is reused only for that version.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Final

from sqlalchemy import Engine, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.ext.asyncio import AsyncSession

from schemas.protocol import StreamName

# How long a snapshot serves decisions: placement.py re-reads what it must be exact on
# (the chosen node), so an older one only misses a better node that appeared since...
MAX_AGE_S: Final = 5.0
# ...and refuses (unplaceable) only from one at most this old.
REFUSE_AGE_S: Final = 0.5

# (device id, backend, free bytes or None, total bytes or None)
Device = tuple[str, str, int | None, int | None]


@dataclass(frozen=True)
class Group:
    """A report's devices of one backend, summarised for the common case: the most free
    memory, the device that has it (the lowest id among equals) and its total; uniform
    when every device with a known free figure has the same total (then the most free
    is also the best fit); the lowest id of a device with unknown free memory."""

    max_free: int | None
    best_id: str
    best_total: int | None
    uniform: bool
    unknown_id: str | None


@dataclass(frozen=True)
class Report:
    version: int
    environments: frozenset[str]
    devices: tuple[Device, ...]
    groups: dict[str, Group]


@dataclass(frozen=True)
class NodeEntry:
    node_id: uuid.UUID
    online: bool
    enabled: bool
    labels: dict[str, Any]
    # None: no runtime report.
    report: Report | None
    runtime_version: int | None
    inventory_version: int | None
    has_roots: bool
    # What the listing said of it: an entry whose listing is unchanged is reused, so
    # placement.py can reuse its judgment of it too.
    seen: tuple[Any, ...]


@dataclass
class Snapshot:
    taken_at: float
    nodes: list[NodeEntry]
    by_id: dict[uuid.UUID, NodeEntry]
    # placement.py's per-snapshot work, by what it depends on; `inherited` is the
    # previous snapshot's (its judgments of entries reused here still hold).
    memo: dict[Any, Any] = field(default_factory=dict)
    inherited: dict[Any, Any] = field(default_factory=dict)
    # The nodes whose entry is new since the previous snapshot (or that are gone); None
    # when there was none.
    changed: set[uuid.UUID] | None = None


# One row of arrays: asyncpg decodes them in C, where 10,000 rows would each cost a
# Python object or two.
_NODES: Final = text(
    """
SELECT array_agg(nodes.id) AS ids, array_agg(nodes.liveness = 'online') AS online,
    array_agg(nodes.enabled) AS enabled, array_agg(nodes.labels::text) AS labels,
    array_agg(s.r_seq) AS r_seq, array_agg(s.i_seq) AS i_seq
FROM nodes
LEFT JOIN (
    SELECT node_id,
        max(coalesce(good_sequence, 0)) FILTER (
            WHERE stream = :runtime_stream AND good_payload IS NOT NULL) AS r_seq,
        max(coalesce(good_sequence, 0)) FILTER (WHERE stream = :inventory_stream) AS i_seq
    FROM node_streams WHERE stream IN (:runtime_stream, :inventory_stream)
    GROUP BY node_id
) AS s ON s.node_id = nodes.id
WHERE nodes.decommissioned_at IS NULL
"""
)

_REPORTS: Final = text(
    """
SELECT node_id, coalesce(good_sequence, 0) AS good_sequence,
    good_payload->'environments' AS environments, good_payload->'devices' AS devices
FROM node_streams WHERE stream = :runtime_stream AND node_id = ANY(:ids)
"""
).bindparams(bindparam("ids", type_=ARRAY(UUID(as_uuid=True))))

_ROOTS: Final = text(
    """
SELECT node_id, coalesce(good_sequence, 0) AS good_sequence,
    coalesce(jsonb_typeof(good_payload->'host'->'artifact_roots') = 'array'
        AND good_payload->'host'->'artifact_roots' <> '[]'::jsonb, false) AS has_roots
FROM node_streams WHERE stream = :inventory_stream AND node_id = ANY(:ids)
"""
).bindparams(bindparam("ids", type_=ARRAY(UUID(as_uuid=True))))

_STREAMS: Final = {
    "runtime_stream": StreamName.RUNTIME.value,
    "inventory_stream": StreamName.INVENTORY.value,
}


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _groups(devices: tuple[Device, ...]) -> dict[str, Group]:
    groups: dict[str, Group] = {}
    for backend in {d[1] for d in devices}:
        mine = [d for d in devices if d[1] == backend]
        known = sorted((d for d in mine if d[2] is not None), key=lambda d: (-(d[2] or 0), d[0]))
        unknown = sorted(d[0] for d in mine if d[2] is None)
        top = known[0] if known else None
        groups[backend] = Group(
            max_free=top[2] if top else None,
            best_id=top[0] if top else "",
            best_total=top[3] if top else None,
            uniform=len({d[3] for d in known}) <= 1,
            unknown_id=unknown[0] if unknown else None,
        )
    return groups


def json_value(value: Any) -> Any:
    """asyncpg hands JSON over as text."""
    return json.loads(value) if isinstance(value, str) else value


def parse_report(version: int, environments: Any, devices: Any) -> Report:
    """The parts of a stored (validated) runtime report the decision reads; anything
    malformed reads as absent."""
    envs = environments if isinstance(environments, list) else []
    devs = devices if isinstance(devices, list) else []
    parsed = tuple(
        (
            str(d.get("device_id")),
            str(d.get("backend")),
            _count(d.get("memory_free_bytes")),
            _count(d.get("memory_total_bytes")),
        )
        for d in devs
        if isinstance(d, dict)
    )
    return Report(
        version=version,
        environments=frozenset(
            str(e["binary_sha256"]) for e in envs if isinstance(e, dict) and "binary_sha256" in e
        ),
        devices=parsed,
        groups=_groups(parsed),
    )


@dataclass
class FleetCache:
    """One per process (built by the worker, passed down): a snapshot per database,
    and the parsed reports and roots by node and version, reused across snapshots
    (bounded by the fleet: a node no longer listed is dropped at the next snapshot)."""

    max_age_s: float = MAX_AGE_S
    refuse_age_s: float = REFUSE_AGE_S
    snapshots: dict[str, Snapshot] = field(default_factory=dict)
    reports: dict[uuid.UUID, Report] = field(default_factory=dict)
    roots: dict[uuid.UUID, tuple[int, bool]] = field(default_factory=dict)
    # Probe figures placement ignored and logged once (store/services/placement.py: need).
    warned: set[tuple[str, int, int]] = field(default_factory=set)

    def fresh(self, session: AsyncSession) -> Snapshot | None:
        snapshot = self.snapshots.get(_database(session))
        if snapshot is None or time.monotonic() - snapshot.taken_at > self.max_age_s:
            return None
        return snapshot

    async def snapshot(self, session: AsyncSession, *, force: bool = False) -> Snapshot:
        if not force and (held := self.fresh(session)) is not None:
            return held
        taken = await self._take(session)
        self.snapshots[_database(session)] = taken
        return taken

    async def _take(self, session: AsyncSession) -> Snapshot:
        taken_at = time.monotonic()
        previous = self.snapshots.get(_database(session))
        before = previous.by_id if previous is not None else {}
        row = (await session.execute(_NODES, _STREAMS)).one()
        listed = list(
            zip(
                row.ids or [],
                row.online or [],
                row.enabled or [],
                row.labels or [],
                row.r_seq or [],
                row.i_seq or [],
                strict=True,
            )
        )
        fresh_items = []
        nodes: list[NodeEntry | None] = []
        for item in listed:
            old = before.get(item[0])
            if old is not None and old.seen == item:
                nodes.append(old)
            else:
                nodes.append(None)
                fresh_items.append(item)
        await self._parse(session, fresh_items)
        labels_of: dict[str, dict[str, Any]] = {}
        for position, entry in enumerate(nodes):
            if entry is not None:
                continue
            item = listed[position]
            node_id, online, enabled, labels_text, r_seq, _ = item
            report = self.reports.get(node_id) if r_seq is not None else None
            held = self.roots.get(node_id)
            labels = labels_of.get(labels_text)
            if labels is None:
                parsed = json_value(labels_text)
                labels = labels_of[labels_text] = parsed if isinstance(parsed, dict) else {}
            nodes[position] = NodeEntry(
                node_id=node_id,
                online=bool(online),
                enabled=bool(enabled),
                labels=labels,
                # A report fetched newer than the listing: its own version counts.
                report=report,
                runtime_version=report.version if report else None,
                inventory_version=held[0] if held else None,
                has_roots=bool(held and held[1]),
                seen=item,
            )
        entries = [entry for entry in nodes if entry is not None]
        if len(self.reports) > 2 * len(entries) + 1000 or len(self.roots) > 2 * len(entries) + 1000:
            keep = {entry.node_id for entry in entries}
            self.reports = {k: v for k, v in self.reports.items() if k in keep}
            self.roots = {k: v for k, v in self.roots.items() if k in keep}
        by_id = {entry.node_id: entry for entry in entries}
        changed = None
        if previous is not None:
            changed = {item[0] for item in fresh_items}
            changed |= {node for node in previous.by_id if node not in by_id}
        return Snapshot(
            taken_at,
            entries,
            by_id,
            inherited=previous.memo if previous is not None else {},
            changed=changed,
        )

    async def _parse(self, session: AsyncSession, changed: list[tuple[Any, ...]]) -> None:
        """Fetch and parse the reports and roots of changed nodes whose version the
        cache does not hold."""
        reports, roots = self.reports, self.roots
        stale_reports = [
            item[0]
            for item in changed
            if item[4] is not None
            and ((entry := reports.get(item[0])) is None or entry.version != item[4])
        ]
        stale_roots = [
            item[0]
            for item in changed
            if item[5] is not None and ((held := roots.get(item[0])) is None or held[0] != item[5])
        ]
        if stale_reports:
            for fetched in await session.execute(_REPORTS, {**_STREAMS, "ids": stale_reports}):
                reports[fetched.node_id] = parse_report(
                    fetched.good_sequence,
                    json_value(fetched.environments),
                    json_value(fetched.devices),
                )
        if stale_roots:
            for fetched in await session.execute(_ROOTS, {**_STREAMS, "ids": stale_roots}):
                roots[fetched.node_id] = (fetched.good_sequence, bool(fetched.has_roots))


def _database(session: AsyncSession) -> str:
    """The snapshot's key: the database the session reads (tests run many)."""
    bind = session.get_bind()
    engine = bind if isinstance(bind, Engine) else bind.engine
    return str(engine.url)
