"""The ordering rules of protocol v1 against a small reference model (hypothesis, stateful).

Per stream (inventory, telemetry) the model keeps a cursor and last-good state:

* sequence <= cursor: 409 sequence_replayed, nothing changes;
* otherwise the cursor advances, and
  - observed_at beyond server time + future-skew limit: 200, applied=false, observed_in_future;
  - observed_at older than last-good's: 200, applied=false, observed_before_last_good;
  - else (equal counts as not older): applied, last-good replaced, reason cleared.
  A not-applied reason stays visible until a good sample arrives.

GPUs reconcile by UUID, and only applied inventories touch them: a GPU is marked missing
only when an applied *complete* inventory omits it; listed GPUs are added, return, or get
their mutable facts updated. After every step the node detail and the node's audit trail
must match the model. One API server serves every example; each example enrolls a node.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from schemas.protocol import AUDIT
from tests.api_server import ApiFactory, RunningApi
from tests.flows import INVENTORY, NODES, TELEMETRY, enroll, gpu, inventory_body, telemetry_body

SKEW_S = 60
# Offsets are kept at least 30 s away from the skew boundary, so the server's clock
# (a few milliseconds later than ours) can never land a sample on the other side.
NEAR_LIMIT_S = SKEW_S - 30
FAR_LIMIT_S = SKEW_S + 30
GPU_POOL = [f"GPU-model-{i}" for i in range(4)]
HOSTNAMES = ["model-host-a", "model-host-b", "model-host-c"]

# How a sample's observed_at is chosen: relative to now, or to the stream's last-good
# observed_at (equal, or one microsecond earlier or later).
observed_choices = st.one_of(
    st.tuples(st.just("now"), st.integers(-7200, NEAR_LIMIT_S)),
    st.tuples(st.just("now"), st.integers(-60, NEAR_LIMIT_S)),
    st.tuples(st.just("future"), st.integers(FAR_LIMIT_S, 86_400)),
    st.tuples(st.sampled_from(["equal_good", "before_good", "after_good"]), st.just(0)),
)
# Mostly advancing, sometimes replaying, now and then jumping far ahead.
sequence_steps = st.one_of(
    st.integers(1, 3), st.integers(1, 3), st.integers(-3, 0), st.integers(4, 1_000_000)
)
gpu_reports = st.lists(st.sampled_from(GPU_POOL), unique=True, max_size=len(GPU_POOL)).flatmap(
    lambda uuids: st.tuples(st.just(uuids), st.permutations(range(len(GPU_POOL))))
)


def parse(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


@dataclass
class StreamModel:
    cursor: int = 0
    good_sequence: int | None = None
    good_observed_at: datetime | None = None
    good_received_at: datetime | None = None
    good_payload: Any = None
    reason: str | None = None
    not_applied_sequence: int | None = None
    not_applied_observed_at: datetime | None = None
    not_applied_received_at: datetime | None = None


@dataclass
class GpuModel:
    index: int
    first_seen_at: datetime
    last_seen_at: datetime
    missing_since: datetime | None = None


@dataclass
class NodeModel:
    hostname: str
    streams: dict[str, StreamModel] = field(
        default_factory=lambda: {"inventory": StreamModel(), "telemetry": StreamModel()}
    )
    gpus: dict[str, GpuModel] = field(default_factory=dict)
    # Audit rows this node's agent caused: (action, target_id) -> count.
    audit: Counter[tuple[str, str]] = field(default_factory=Counter)


def ordering_machine(api: RunningApi, client: httpx.Client) -> type[RuleBasedStateMachine]:
    class OrderingMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            node = enroll(client, api, hostname=HOSTNAMES[0])
            self.node_id = node.node_id
            self.headers = node.headers
            self.model = NodeModel(hostname=HOSTNAMES[0])
            self.model.audit[("node.enrolled", self.node_id)] += 1

        # -- the model ------------------------------------------------------------

        def observed_at(self, stream: str, choice: tuple[str, int]) -> datetime:
            kind, offset = choice
            now = datetime.now(UTC)
            good = self.model.streams[stream].good_observed_at
            if kind == "now" or (kind != "future" and good is None):
                return now + timedelta(seconds=offset)
            if kind == "future":
                return now + timedelta(seconds=offset)
            assert good is not None
            shift = {"equal_good": 0, "before_good": -1, "after_good": 1}[kind]
            return good + timedelta(microseconds=shift)

        def expect(self, stream: str, sequence: int, observed_at: datetime) -> str | None:
            """'replay', a not-applied reason, or None for applied."""
            model = self.model.streams[stream]
            if sequence <= model.cursor:
                return "replay"
            # Safe to decide against our clock: offsets keep 30 s from the boundary.
            if observed_at > datetime.now(UTC) + timedelta(seconds=SKEW_S):
                return "observed_in_future"
            if model.good_observed_at is not None and observed_at < model.good_observed_at:
                return "observed_before_last_good"
            return None

        def send(
            self, stream: str, url: str, body: dict[str, Any], payload: Any
        ) -> tuple[str | None, datetime | None]:
            sequence = body["sequence"]
            observed_at = datetime.fromisoformat(body["observed_at"])
            expected = self.expect(stream, sequence, observed_at)
            model = self.model.streams[stream]
            response = client.put(url, json=body, headers=self.headers)
            event(f"{stream}: {expected or 'applied'}")
            if expected == "replay":
                assert response.status_code == 409, response.text
                error = response.json()
                assert error["code"] == "sequence_replayed"
                assert error["extra"] == {"stream": stream, "cursor": model.cursor}
                return expected, None
            assert response.status_code == 200, response.text
            result = response.json()
            received_at = parse(result["received_at"])
            assert received_at is not None
            assert (result["stream"], result["sequence"]) == (stream, sequence)
            assert result["applied"] is (expected is None), (expected, result)
            assert result["reason"] == expected
            model.cursor = sequence
            if expected is None:
                model.good_sequence = sequence
                model.good_observed_at = observed_at
                model.good_received_at = received_at
                model.good_payload = payload
                model.reason = None
                model.not_applied_sequence = None
                model.not_applied_observed_at = None
                model.not_applied_received_at = None
            else:
                model.reason = expected
                model.not_applied_sequence = sequence
                model.not_applied_observed_at = observed_at
                model.not_applied_received_at = received_at
            return expected, received_at

        def reconcile(
            self, reported: list[tuple[str, int]], complete: bool, hostname: str, at: datetime
        ) -> None:
            model = self.model
            if hostname != model.hostname:
                model.hostname = hostname
                model.audit[("node.updated", self.node_id)] += 1
            for uuid, index in reported:
                target = f"{self.node_id}/{uuid}"
                known = model.gpus.get(uuid)
                if known is None:
                    model.gpus[uuid] = GpuModel(index=index, first_seen_at=at, last_seen_at=at)
                    model.audit[("node.gpu.added", target)] += 1
                    continue
                known.last_seen_at = at
                if known.missing_since is not None:
                    known.missing_since = None
                    model.audit[("node.gpu.returned", target)] += 1
                if known.index != index:
                    known.index = index
                    model.audit[("node.gpu.changed", target)] += 1
            if not complete:
                return
            listed = {uuid for uuid, _ in reported}
            for uuid, known in model.gpus.items():
                if uuid not in listed and known.missing_since is None:
                    known.missing_since = at
                    model.audit[("node.gpu.missing", f"{self.node_id}/{uuid}")] += 1

        # -- the rules ------------------------------------------------------------

        @rule(
            step=sequence_steps,
            observed=observed_choices,
            complete=st.booleans(),
            report=gpu_reports,
            hostname=st.sampled_from(HOSTNAMES),
        )
        def inventory(
            self,
            step: int,
            observed: tuple[str, int],
            complete: bool,
            report: tuple[list[str], tuple[int, ...]],
            hostname: str,
        ) -> None:
            uuids, indexes = report
            reported = list(zip(uuids, indexes, strict=False))
            sequence = max(1, self.model.streams["inventory"].cursor + step)
            body = inventory_body(
                self.node_id,
                sequence,
                observed_at=self.observed_at("inventory", observed),
                complete=complete,
                gpus=[gpu(index, uuid) for uuid, index in reported],
                hostname=hostname,
            )
            outcome, received_at = self.send(
                "inventory", INVENTORY, body, {"complete": complete, "hostname": hostname}
            )
            if outcome is None:
                assert received_at is not None
                self.reconcile(reported, complete, hostname, received_at)
            self.check()

        @rule(
            step=sequence_steps,
            observed=observed_choices,
            ram_used=st.integers(0, 2**38),
        )
        def telemetry(self, step: int, observed: tuple[str, int], ram_used: int) -> None:
            sequence = max(1, self.model.streams["telemetry"].cursor + step)
            body = telemetry_body(
                self.node_id,
                sequence,
                observed_at=self.observed_at("telemetry", observed),
                gpu_uuids=GPU_POOL[:2],
            )
            body["ram_used_bytes"] = ram_used
            self.send("telemetry", TELEMETRY, body, {"ram_used_bytes": ram_used})
            self.check()

        # -- the comparison -------------------------------------------------------

        def check(self) -> None:
            api.settle()
            response = client.get(f"{NODES}/{self.node_id}", headers=api.admin_headers)
            assert response.status_code == 200, response.text
            detail = response.json()
            for name in ("inventory", "telemetry"):
                model = self.model.streams[name]
                actual = detail[f"{name}_stream"]
                assert actual["cursor"] == model.cursor, name
                assert actual["good_sequence"] == model.good_sequence, name
                assert parse(actual["good_observed_at"]) == model.good_observed_at, name
                assert parse(actual["good_received_at"]) == model.good_received_at, name
                assert actual["not_applied_reason"] == model.reason, name
                assert actual["not_applied_sequence"] == model.not_applied_sequence, name
                assert parse(actual["not_applied_observed_at"]) == model.not_applied_observed_at
                assert parse(actual["not_applied_received_at"]) == model.not_applied_received_at

            inventory = self.model.streams["inventory"].good_payload
            if inventory is None:
                assert detail["inventory"] is None
            else:
                assert detail["inventory"]["complete"] is inventory["complete"]
                assert detail["inventory"]["host"]["hostname"] == inventory["hostname"]
            telemetry = self.model.streams["telemetry"].good_payload
            if telemetry is None:
                assert detail["telemetry"] is None
            else:
                assert detail["telemetry"]["ram_used_bytes"] == telemetry["ram_used_bytes"]
            assert detail["hostname"] == self.model.hostname

            actual_gpus = {
                g["uuid"]: (
                    g["index"],
                    g["pci_bus_id"],
                    g["missing"],
                    parse(g["missing_since"]),
                    parse(g["first_seen_at"]),
                    parse(g["last_seen_at"]),
                )
                for g in detail["gpus"]
            }
            expected_gpus = {
                uuid: (
                    m.index,
                    gpu(m.index)["pci_bus_id"],
                    m.missing_since is not None,
                    m.missing_since,
                    m.first_seen_at,
                    m.last_seen_at,
                )
                for uuid, m in self.model.gpus.items()
            }
            assert actual_gpus == expected_gpus

            audit = client.get(
                AUDIT,
                headers=api.admin_headers,
                params={"actor": f"node:{self.node_id}", "limit": 1000},
            )
            assert audit.status_code == 200
            rows = Counter((row["action"], row["target_id"]) for row in audit.json()["items"])
            assert rows == self.model.audit

    return OrderingMachine


def test_ordering_and_gpu_reconciliation_match_the_model(api_factory: ApiFactory) -> None:
    api = api_factory(future_skew_limit_s=SKEW_S)
    with api.client() as client:
        machine = ordering_machine(api, client)
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=30,
                stateful_step_count=15,
                deadline=None,
                database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
            ),
        )


def test_equal_observed_at_is_applied_and_reason_stays_until_good(api_factory: ApiFactory) -> None:
    """The boundaries the model relies on, spelled out once as a plain example."""
    api = api_factory(future_skew_limit_s=SKEW_S)
    with api.client() as client:
        node = enroll(client, api)
        base = datetime.now(UTC) - timedelta(minutes=5)
        detail_url = f"{NODES}/{node.node_id}"

        def put(sequence: int, observed_at: datetime) -> httpx.Response:
            body = telemetry_body(node.node_id, sequence, observed_at=observed_at)
            return client.put(TELEMETRY, json=body, headers=node.headers)

        def stream() -> dict[str, Any]:
            state: dict[str, Any] = client.get(detail_url, headers=api.admin_headers).json()[
                "telemetry_stream"
            ]
            return state

        assert put(5, base).json()["applied"] is True
        # Equal observed_at with a higher sequence: applied.
        equal = put(6, base).json()
        assert (equal["applied"], equal["reason"]) == (True, None)
        assert stream()["good_sequence"] == 6
        # One microsecond older: not applied, cursor advances, reason visible.
        older = put(7, base - timedelta(microseconds=1)).json()
        assert (older["applied"], older["reason"]) == (False, "observed_before_last_good")
        state = stream()
        assert (state["cursor"], state["good_sequence"]) == (7, 6)
        assert state["not_applied_reason"] == "observed_before_last_good"
        # A replay changes nothing, and the reason stays.
        replay = put(7, base + timedelta(seconds=1))
        assert replay.status_code == 409
        assert replay.json()["code"] == "sequence_replayed"
        assert stream() == state
        # Far in the future: the reason switches, last-good still kept.
        future = put(8, datetime.now(UTC) + timedelta(seconds=FAR_LIMIT_S + 600)).json()
        assert (future["applied"], future["reason"]) == (False, "observed_in_future")
        state = stream()
        assert (state["cursor"], state["good_sequence"]) == (8, 6)
        assert state["not_applied_reason"] == "observed_in_future"
        # Within the skew limit (ahead of the server, but not too far): applied; reason cleared.
        ahead = put(9, datetime.now(UTC) + timedelta(seconds=NEAR_LIMIT_S)).json()
        assert (ahead["applied"], ahead["reason"]) == (True, None)
        state = stream()
        assert (state["cursor"], state["good_sequence"]) == (9, 9)
        assert state["not_applied_reason"] is None
        assert state["not_applied_sequence"] is None
