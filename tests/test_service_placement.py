"""The scheduler's decision (store/services/placement.py) on a real PostgreSQL: every
filter counted by the first reason that ruled a node out, fit against free memory with
the figures in the message, the scores (the artifact held, spread, measured evidence),
and a deterministic choice. The fleet is written as the API leaves it (nodes, their
runtime and inventory streams, artifacts, replicas, deployments): rows, not mocks."""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from schemas.protocol import StreamName
from schemas.services import PlacementReason
from store.deployments.tables import Deployment
from store.models import Job, Node, NodeArtifact, NodeStream
from store.runtime_tables import RuntimeEnvironment, RuntimeEvidence, RuntimeProfile
from store.services import judgment, placement
from store.services.estimate import GiB
from store.services.placement import decide
from store.services.snapshot import FleetCache
from store.services.tables import Service, ServiceReplica
from tests.placement_flows import COMMIT, DIGEST, PATH, REPO, sized_template

ENV = "a" * 64
OTHER_ENV = "b" * 64
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def device(
    device_id: str = "gpu:0",
    backend: str = "cuda",
    free: int | None = 40 * GiB,
    total: int = 80 * GiB,
) -> dict[str, Any]:
    return {
        "device_id": device_id,
        "backend": backend,
        "memory_free_bytes": free,
        "memory_total_bytes": total,
        "queue_depth": 0,
    }


class Fleet:
    """Writes a fleet's rows in one session; `decide` reads them in another."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions = sessions
        self.rows: list[Any] = []
        self.count = 0
        # Every decision on a snapshot of its own (the snapshot's reuse has its own tests).
        self.cache = FleetCache(max_age_s=0, refuse_age_s=0)
        self.profile = RuntimeProfile(
            id=uuid.uuid4(), name="p", version=1, settings={}, created_at=NOW
        )

    def node(
        self,
        *,
        liveness: str = "online",
        enabled: bool = True,
        labels: dict[str, str] | None = None,
        devices: list[dict[str, Any]] | None = None,
        environments: list[str] | None = None,
        runtime: bool = True,
        roots: list[str] | None = None,
        decommissioned: bool = False,
        node_id: uuid.UUID | None = None,
    ) -> uuid.UUID:
        self.count += 1
        node = Node(
            id=node_id or uuid.uuid4(),
            hostname=f"host-{self.count}",
            labels=labels or {},
            enabled=enabled,
            protocol_version=1,
            agent_version="test",
            liveness=liveness,
            decommissioned_at=NOW if decommissioned else None,
        )
        self.rows.append(node)
        if runtime:
            payload = {
                "devices": [device()] if devices is None else devices,
                "environments": [
                    {"binary_sha256": sha, "version": "b1", "backend": "cuda"}
                    for sha in ([ENV] if environments is None else environments)
                ],
            }
            self.stream(node.id, StreamName.RUNTIME, payload)
        inventory = {"host": {"artifact_roots": ["/models"] if roots is None else roots}}
        self.stream(node.id, StreamName.INVENTORY, inventory)
        return node.id

    def stream(self, node_id: uuid.UUID, name: StreamName, payload: dict[str, Any]) -> None:
        """The node's last good report on one stream."""
        self.rows.append(
            NodeStream(node_id=node_id, stream=name.value, good_sequence=1, good_payload=payload)
        )

    def job(self, node_id: uuid.UUID) -> uuid.UUID:
        job = Job(
            id=uuid.uuid4(),
            kind="artifact.acquire.v1",
            node_id=node_id,
            state="succeeded",
            spec={},
            max_attempts=1,
            available_at=NOW,
            created_at=NOW,
            updated_at=NOW,
        )
        self.rows.append(job)
        return job.id

    def holds(self, node_id: uuid.UUID) -> None:
        files = [{"path": PATH, "size": 1, "digest": {"algorithm": "sha256", "value": DIGEST}}]
        self.rows.append(
            NodeArtifact(
                node_id=node_id,
                root="/models",
                repository=REPO,
                commit=COMMIT,
                files=files,
                job_id=self.job(node_id),
                recorded_at=NOW,
            )
        )

    def service(
        self,
        *,
        need: int = 5 * GiB,
        selector: dict[str, str] | None = None,
        device_kind: str | None = None,
        max_per_node: int = 1,
        backoff: dict[str, Any] | None = None,
        environment_id: uuid.UUID | None = None,
    ) -> Service:
        template = sized_template(need, self.profile.id, environment_id)
        service = Service(
            id=uuid.uuid4(),
            name=f"svc-{uuid.uuid4().hex[:8]}",
            roles=[],
            state="active",
            template=template.model_dump(mode="json"),
            generation=1,
            replicas=1,
            placement={
                "selector": selector or {},
                "device_kind": device_kind,
                "max_per_node": max_per_node,
            },
            strategy={},
            rollout_state="complete",
            backoff=backoff or {},
            created_at=NOW,
            updated_at=NOW,
        )
        self.rows.append(service)
        return service

    def replica(self, service: Service, node_id: uuid.UUID, device_id: str, phase: str) -> None:
        self.rows.append(
            ServiceReplica(
                id=uuid.uuid4(),
                service_id=service.id,
                generation=1,
                node_id=node_id,
                device_id=device_id,
                phase=phase,
                created_at=NOW,
                updated_at=NOW,
                phase_changed_at=NOW,
            )
        )

    def environment(self, sha: str, first_node: uuid.UUID) -> uuid.UUID:
        env = RuntimeEnvironment(
            id=uuid.uuid4(),
            binary_sha256=sha,
            version="b1",
            backend="cuda",
            first_reported_at=NOW,
            first_node_id=first_node,
        )
        self.rows.append(env)
        return env.id

    def deployment(self, node_id: uuid.UUID, env_id: uuid.UUID, state: str) -> None:
        self.rows.append(
            Deployment(
                id=uuid.uuid4(),
                model=f"m-{uuid.uuid4().hex[:6]}",
                roles=[],
                node_id=node_id,
                device_id="gpu:0",
                artifact={},
                profile_id=self.profile.id,
                profile_version=1,
                environment_id=env_id,
                spec={},
                state=state,
                max_concurrent=1,
                max_attempts=1,
                created_at=NOW,
                updated_at=NOW,
                state_changed_at=NOW,
            )
        )

    def evidence(self, node_id: uuid.UUID, env_id: uuid.UUID, **values: Any) -> None:
        self.rows.append(
            RuntimeEvidence(
                node_id=node_id,
                device_id="gpu:0",
                artifact_digest=DIGEST,
                profile_id=self.profile.id,
                environment_id=env_id,
                artifact_path="/models/x",
                health={},
                evidence={"load_s": 1.0, "time_to_first_token_s": 0.1, **values},
                job_id=self.job(node_id),
                recorded_at=NOW,
            )
        )

    async def commit(self) -> None:
        """Nodes first (the others refer to them), then the rest, in one transaction."""
        async with self.sessions() as session, session.begin():
            session.add(self.profile)
            order = (Node, NodeStream, RuntimeEnvironment, Job, Service)
            for kind in order:
                session.add_all([row for row in self.rows if isinstance(row, kind)])
                await session.flush()
            session.add_all([row for row in self.rows if not isinstance(row, order)])
        self.rows = []

    async def decide(self, service: Service, cache: FleetCache | None = None) -> Any:
        async with self.sessions() as session:
            return await decide(session, service, NOW, self.cache if cache is None else cache)


@pytest.fixture
async def fleet(sessions: async_sessionmaker[AsyncSession]) -> AsyncIterator[Fleet]:
    yield Fleet(sessions)


async def test_every_node_is_counted_once_by_the_first_reason_that_ruled_it_out(
    fleet: Fleet,
) -> None:
    zone = {"zone": "a"}
    first = fleet.node(labels=zone)
    env_id = fleet.environment(ENV, first)
    service = fleet.service(
        selector=zone,
        device_kind="cuda",
        environment_id=env_id,
        backoff={},
    )
    fleet.node(labels=zone, liveness="offline")
    fleet.node(labels=zone, liveness="stale")
    fleet.node(labels=zone, enabled=False)
    fleet.node(labels={"zone": "b"})
    fleet.node(labels=zone, runtime=False)
    fleet.node(labels=zone, environments=[OTHER_ENV])
    fleet.node(labels=zone, devices=[device("cpu", "cpu")])
    busy = fleet.node(labels=zone)
    fleet.node(labels=zone, devices=[device(free=2 * GiB)])
    spread = fleet.node(labels=zone, devices=[device("gpu:0"), device("gpu:1")])
    backed_off = fleet.node(labels=zone)
    fleet.node(labels=zone, roots=[])
    fleet.node(labels=zone, decommissioned=True)
    other = fleet.service()
    fleet.replica(other, busy, "gpu:0", "ready")
    fleet.replica(service, spread, "gpu:0", "ready")
    service.backoff = {
        str(backed_off): {"until": (NOW + timedelta(minutes=5)).isoformat(), "failures": 1}
    }
    # An ended replica holds nothing: the first node stays feasible.
    fleet.replica(other, first, "gpu:0", "ended")
    await fleet.commit()

    receipt = await fleet.decide(service)

    assert receipt.outcome == "placed", receipt.message
    assert receipt.node_id == first
    assert receipt.nodes_considered == 13  # the decommissioned node is not one
    assert receipt.feasible == 1
    assert receipt.rejected == {
        PlacementReason.OFFLINE: 2,
        PlacementReason.DISABLED: 1,
        PlacementReason.SELECTOR: 1,
        PlacementReason.NO_RUNTIME: 1,
        PlacementReason.ENVIRONMENT: 1,
        PlacementReason.DEVICE_KIND: 1,
        PlacementReason.DEVICE_BUSY: 1,
        PlacementReason.INSUFFICIENT_MEMORY: 1,
        PlacementReason.SPREAD: 1,
        PlacementReason.BACKOFF: 1,
        PlacementReason.NO_ROOT: 1,
    }
    assert "1 of 13 nodes feasible" in receipt.message


async def test_a_device_too_small_is_refused_and_the_message_names_the_need_and_the_best(
    fleet: Fleet,
) -> None:
    service = fleet.service(need=5 * GiB)
    fleet.node(devices=[device(free=3 * GiB)])
    fleet.node(devices=[device(free=4 * GiB), device("gpu:1", free=1 * GiB)])
    fleet.node(liveness="offline")
    await fleet.commit()

    receipt = await fleet.decide(service)

    need = placement.headroom(5 * GiB)
    assert receipt.outcome == "unplaceable"
    assert receipt.node_id is None
    assert receipt.needs_bytes == need
    assert receipt.best_free_bytes == 4 * GiB
    assert receipt.rejected == {
        PlacementReason.INSUFFICIENT_MEMORY: 2,
        PlacementReason.OFFLINE: 1,
    }
    assert receipt.message == (
        f"0 of 3 nodes: 2 insufficient memory (needs {need / GiB:.1f} GiB, best 4.0 GiB), 1 offline"
    )


async def test_a_node_holding_the_artifact_wins_over_an_emptier_one(fleet: Fleet) -> None:
    service = fleet.service(need=5 * GiB)
    emptier = fleet.node(devices=[device(free=75 * GiB)])
    holder = fleet.node(devices=[device(free=10 * GiB)])
    fleet.holds(holder)
    await fleet.commit()

    receipt = await fleet.decide(service)

    assert (receipt.node_id, receipt.device_id) == (holder, "gpu:0")
    assert receipt.holds_artifact
    assert receipt.score["artifact"] == 1.0
    assert "holds the artifact" in receipt.message

    # Without the artifact anywhere, the emptier device fits best.
    other = fleet.service(need=5 * GiB)
    other.template = {
        **other.template,
        "artifact": {**other.template["artifact"], "commit": "e" * 40},
    }
    await fleet.commit()
    receipt = await fleet.decide(other)
    assert receipt.node_id == emptier
    assert not receipt.holds_artifact
    assert "acquires the artifact first" in receipt.message


async def test_spread_prefers_the_node_with_fewer_of_the_service_replicas(fleet: Fleet) -> None:
    service = fleet.service(max_per_node=2)
    crowded = fleet.node(devices=[device("gpu:0"), device("gpu:1")])
    empty = fleet.node(devices=[device("gpu:0"), device("gpu:1")])
    fleet.replica(service, crowded, "gpu:0", "ready")
    await fleet.commit()

    receipt = await fleet.decide(service)
    assert receipt.node_id == empty
    assert receipt.score["spread"] == 1.0

    # max_per_node 2: the crowded node still takes one more, on its free device.
    async with fleet.sessions() as session, session.begin():
        session.add(
            ServiceReplica(
                id=uuid.uuid4(),
                service_id=service.id,
                generation=1,
                node_id=empty,
                device_id="gpu:0",
                phase="acquiring",
                created_at=NOW,
                updated_at=NOW,
                phase_changed_at=NOW,
            )
        )
    receipt = await fleet.decide(service)
    assert receipt.node_id == min(crowded, empty)
    assert receipt.device_id == "gpu:1"
    assert receipt.score["spread"] == 0.5


async def test_backoff_holds_a_node_back_until_its_time(fleet: Fleet) -> None:
    node = fleet.node()
    until = NOW + timedelta(seconds=30)
    service = fleet.service(backoff={str(node): {"until": until.isoformat(), "failures": 2}})
    await fleet.commit()

    receipt = await fleet.decide(service)
    assert receipt.outcome == "unplaceable"
    assert receipt.rejected == {PlacementReason.BACKOFF: 1}

    async with fleet.sessions() as session:
        later = await decide(session, service, until + timedelta(seconds=1), fleet.cache)
    assert later.node_id == node


async def test_a_device_serving_a_deployment_is_busy_until_it_is_unloaded(fleet: Fleet) -> None:
    serving = fleet.node()
    unloaded = fleet.node()
    env_id = fleet.environment(ENV, serving)
    fleet.deployment(serving, env_id, "ready")
    fleet.deployment(unloaded, env_id, "unloaded")
    service = fleet.service()
    await fleet.commit()

    receipt = await fleet.decide(service)
    assert receipt.node_id == unloaded
    assert receipt.rejected == {PlacementReason.DEVICE_BUSY: 1}


async def test_the_environment_must_be_reported(fleet: Fleet) -> None:
    right = fleet.node(environments=[OTHER_ENV, ENV])
    fleet.node(environments=[OTHER_ENV])
    fleet.node(environments=[])
    env_id = fleet.environment(ENV, right)
    pinned = fleet.service(environment_id=env_id)
    anyone = fleet.service()
    await fleet.commit()

    receipt = await fleet.decide(pinned)
    assert receipt.node_id == right
    assert receipt.rejected == {PlacementReason.ENVIRONMENT: 2}

    # No environment named: any the node reports, but it must report one.
    receipt = await fleet.decide(anyone)
    assert receipt.rejected == {PlacementReason.ENVIRONMENT: 1}
    assert receipt.feasible == 2

    # An environment nobody knows matches no node.
    unknown = fleet.service(environment_id=uuid.uuid4())
    await fleet.commit()
    receipt = await fleet.decide(unknown)
    assert receipt.rejected == {PlacementReason.ENVIRONMENT: 3}


async def test_the_device_kind_filter(fleet: Fleet) -> None:
    cpu_only = fleet.node(devices=[device("cpu", "cpu", free=30 * GiB)])
    gpu_only = fleet.node(devices=[device("gpu:0", "cuda")])
    on_cpu = fleet.service(device_kind="cpu")
    on_gpu = fleet.service(device_kind="cuda")
    await fleet.commit()

    receipt = await fleet.decide(on_cpu)
    assert (receipt.node_id, receipt.device_id) == (cpu_only, "cpu")
    assert receipt.rejected == {PlacementReason.DEVICE_KIND: 1}
    receipt = await fleet.decide(on_gpu)
    assert (receipt.node_id, receipt.device_id) == (gpu_only, "gpu:0")
    assert receipt.rejected == {PlacementReason.DEVICE_KIND: 1}


async def test_unknown_free_memory_is_accepted_with_the_lowest_fit(fleet: Fleet) -> None:
    unknown = fleet.node(devices=[device(free=None)])
    service = fleet.service()
    await fleet.commit()
    receipt = await fleet.decide(service)
    assert receipt.node_id == unknown
    assert receipt.score["fit"] == 0.0
    assert "free memory not reported" in receipt.message

    known = fleet.node(devices=[device(free=10 * GiB)])
    await fleet.commit()
    receipt = await fleet.decide(service)
    assert receipt.node_id == known


async def test_measured_evidence_refines_the_need_and_scores(fleet: Fleet) -> None:
    small = fleet.node(devices=[device(free=4 * GiB, total=8 * GiB)])
    env_id = fleet.environment(ENV, small)
    # The estimate says 20 GiB; a probe of the same artifact and profile measured 2.
    service = fleet.service(need=20 * GiB)
    fleet.evidence(small, env_id, vram_used_bytes=2 * GiB, generation_tokens_per_s=40.0)
    await fleet.commit()

    receipt = await fleet.decide(service)
    assert receipt.node_id == small
    assert receipt.needs_bytes == placement.headroom(2 * GiB)
    assert receipt.score["evidence"] == 1.0


async def test_the_choice_is_deterministic(fleet: Fleet) -> None:
    ids = sorted(uuid.uuid4() for _ in range(4))
    for node_id in reversed(ids):
        fleet.node(node_id=node_id)
    service = fleet.service()
    await fleet.commit()
    receipts = [await fleet.decide(service) for _ in range(3)]
    assert {(r.node_id, r.device_id) for r in receipts} == {(ids[0], "gpu:0")}
    assert receipts[0].feasible == 4


async def test_an_empty_fleet(fleet: Fleet) -> None:
    service = fleet.service()
    await fleet.commit()
    receipt = await fleet.decide(service)
    assert receipt.outcome == "unplaceable"
    assert receipt.nodes_considered == 0
    assert receipt.message == "0 of 0 nodes: no node is enrolled"


async def test_a_held_snapshot_never_places_on_a_node_that_changed_nor_refuses(
    fleet: Fleet,
) -> None:
    """A snapshot serves decisions for its max age; the chosen node is read again (a
    disabled one is not placed on), and "unplaceable" comes from a snapshot taken in the
    same call (a node enrolled since is found)."""
    held = FleetCache(max_age_s=3600, refuse_age_s=0)
    service = fleet.service()
    await fleet.commit()
    receipt = await fleet.decide(service, held)
    assert receipt.outcome == "unplaceable"

    first = fleet.node(devices=[device(free=70 * GiB)])
    second = fleet.node(devices=[device(free=20 * GiB)])
    await fleet.commit()
    receipt = await fleet.decide(service, held)
    assert receipt.node_id == first  # the refusal's fresh look found them

    async with fleet.sessions() as session, session.begin():
        node = await session.get(Node, first)
        assert node is not None
        node.enabled = False
    receipt = await fleet.decide(service, held)
    assert receipt.node_id == second
    assert receipt.rejected == {PlacementReason.DISABLED: 1}

    # A report with less memory is a new version: the decision reads it.
    async with fleet.sessions() as session, session.begin():
        stream = await session.get(NodeStream, (second, StreamName.RUNTIME.value))
        assert stream is not None and stream.good_payload is not None
        stream.good_payload = {**stream.good_payload, "devices": [device(free=1 * GiB)]}
        stream.good_sequence = 2
    receipt = await fleet.decide(service, held)
    assert receipt.outcome == "unplaceable"
    assert receipt.rejected == {
        PlacementReason.DISABLED: 1,
        PlacementReason.INSUFFICIENT_MEMORY: 1,
    }


async def test_a_snapshot_updated_from_the_last_decides_as_one_taken_afresh(
    fleet: Fleet,
) -> None:
    """The incremental path (a snapshot judged from the previous one's judgment: changed
    reports, nodes disabled, devices taken and freed) against a cache with no past, over
    more nodes than the top lists hold, round after round."""
    rng = random.Random(32)
    ids = [
        fleet.node(devices=[device(f"gpu:{g}", free=rng.randrange(0, 81) * GiB) for g in range(2)])
        for _ in range(judgment.TOP + 60)
    ]
    service = fleet.service(need=20 * GiB, max_per_node=2)
    other = fleet.service()
    await fleet.commit()
    kept = FleetCache(max_age_s=0, refuse_age_s=0)
    sequence = 1
    for _ in range(12):
        sequence += 1
        async with fleet.sessions() as session, session.begin():
            for node_id in rng.sample(ids, 15):
                stream = await session.get(NodeStream, (node_id, StreamName.RUNTIME.value))
                assert stream is not None and stream.good_payload is not None
                devices = [device(f"gpu:{g}", free=rng.randrange(0, 81) * GiB) for g in range(2)]
                stream.good_payload = {**stream.good_payload, "devices": devices}
                stream.good_sequence = sequence
            node = await session.get(Node, rng.choice(ids))
            assert node is not None
            node.enabled = not node.enabled
            for owner in (service, other):
                session.add(
                    ServiceReplica(
                        id=uuid.uuid4(),
                        service_id=owner.id,
                        generation=1,
                        node_id=rng.choice(ids),
                        device_id=f"gpu:{rng.randrange(2)}",
                        phase=rng.choice(["ready", "ended"]),
                        created_at=NOW,
                        updated_at=NOW,
                        phase_changed_at=NOW,
                    )
                )
            try:
                await session.flush()
            except IntegrityError:
                await session.rollback()  # that device was taken: another round
                continue
        incremental = await fleet.decide(service, kept)
        afresh = await fleet.decide(service, FleetCache(max_age_s=0, refuse_age_s=0))
        assert incremental == afresh


async def test_evidence_past_its_device_or_the_estimate_or_from_a_gone_node_is_not_the_need(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    """One node's probe must not make a service unplaceable fleet-wide (review R1): a
    figure is capped at the measuring device's total memory, one more than four times
    the estimate is ignored (and logged), and a decommissioned node's is not counted."""
    fit = fleet.node(devices=[device(free=30 * GiB, total=40 * GiB)])
    env_id = fleet.environment(ENV, fit)
    service = fleet.service(need=5 * GiB)
    # Reported by a node whose gpu:0 has 8 GiB: at most 8 GiB, whatever it says.
    small = fleet.node(devices=[device(free=1 * GiB, total=8 * GiB)], enabled=False)
    fleet.evidence(small, env_id, vram_used_bytes=2**53 - 1)
    await fleet.commit()
    receipt = await fleet.decide(service)
    assert receipt.node_id == fit, receipt.message
    assert receipt.needs_bytes == placement.headroom(8 * GiB)

    # A node without a runtime report (its device's total unknown): 2^53 - 1 is far
    # more than four times the estimate, so it is ignored and the estimate stands.
    unknown = fleet.node(runtime=False, enabled=False)
    fleet.evidence(unknown, env_id, vram_used_bytes=2**53 - 1, peak_rss_bytes=2**53 - 1)
    await fleet.commit()
    with caplog.at_level("WARNING", logger="store.services.placement"):
        receipt = await fleet.decide(service)
    assert receipt.node_id == fit, receipt.message
    assert receipt.needs_bytes == placement.headroom(8 * GiB)
    assert any("ignored" in record.getMessage() for record in caplog.records)
    # Said once: the next decision (a sweep every few seconds) does not repeat it.
    caplog.clear()
    with caplog.at_level("WARNING", logger="store.services.placement"):
        await fleet.decide(service)
    assert not any("ignored" in record.getMessage() for record in caplog.records)

    # A decommissioned node's evidence is not counted at all.
    gone = fleet.node(devices=[device(free=1 * GiB, total=16 * GiB)], decommissioned=True)
    fleet.evidence(gone, env_id, vram_used_bytes=12 * GiB)
    await fleet.commit()
    receipt = await fleet.decide(service)
    assert receipt.needs_bytes == placement.headroom(8 * GiB)
