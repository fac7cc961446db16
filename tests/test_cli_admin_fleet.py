"""`modelforge admin` on the fleet, over the real API, its event pipeline and the
workers' real liveness sweep: `nodes list -w` follows liveness and node changes as they
happen, `fleet acknowledge` releases a partition hold, `tokens create --node` re-binds a
node's identity. Every refusal is the CLI's one line."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from schemas.admin import (
    EnrollmentTokenCreated,
    FleetIncidentInfo,
    FleetIncidentList,
    FleetSafety,
    Liveness,
    NodeDetail,
    NodeList,
)
from schemas.events import EventType
from schemas.protocol import ENROLL, FLEET
from store.engine import make_engine, make_sessionmaker
from store.fleet import PartitionBreaker
from store.liveness import LivenessThresholds
from store.liveness_sweep import Transition, sweep
from tests.admin_helpers import beat, get_node, patch_node, refused
from tests.agent.harness import wait_until
from tests.api_server import ApiFactory, RunningApi, api_on_thresholds
from tests.cli_support import Admin, Running, containing, failed, ok
from tests.flows import NO_BREAKER, EnrolledNode, enroll, enroll_body
from tests.services import run_async

pytest_plugins = ["tests.cli_fixtures"]

# As tests/test_fleet_safety.py runs them: silence shows within seconds, and the API's
# presence (every 0.1 s) well inside its gap, so the sweep is never held for that.
THRESHOLDS = LivenessThresholds(
    stale_after_s=1.5, offline_after_s=3.0, restart_grace_s=1.5, presence_gap_s=0.4
)
BREAKER = PartitionBreaker(share=0.3, min_nodes=10)
# Long enough for a silent node to pass a threshold, and the sweep to see it, on a
# loaded box.
SWEPT_S = 20.0


@pytest.fixture
def api(api_factory: ApiFactory) -> RunningApi:
    """The API the `admin` and `background` fixtures talk to, on the thresholds above."""
    return api_on_thresholds(api_factory, THRESHOLDS)


def sweep_once(api: RunningApi, breaker: PartitionBreaker) -> list[Transition]:
    """One run of the workers' liveness sweep on the API's database, as a worker does it."""

    async def run() -> list[Transition]:
        engine = make_engine(api.settings.database_url, pool_size=2)
        try:
            return await sweep(make_sessionmaker(engine), THRESHOLDS, breaker=breaker)
        finally:
            await engine.dispose()

    return run_async(run)


def online(client: httpx.Client, api: RunningApi, node: EnrolledNode) -> None:
    """A heartbeat, then (bounded) the node recorded online: a first heartbeat lands with
    the API's next group commit."""
    assert beat(client, node).status_code == 200
    wait_until(
        lambda: get_node(client, api, node.node_id)["liveness"] == "online",
        SWEPT_S,
        f"{node.node_id} online",
    )


def test_nodes_list_watch_shows_liveness_and_node_changes(
    background: Any, admin: Admin, api: RunningApi
) -> None:
    with api.client() as client:
        steady = enroll(client, api, "steady-node")
        silent = enroll(client, api, "silent-node")
        online(client, api, steady)
        online(client, api, silent)
        # Every event so far relayed: the lines below are the changes made after this.
        api.settle()
        watch: Running = background("nodes", "list", "-w")
        # The table, drawn once the stream is subscribed: from then on nothing is missed.
        watch.line(containing("HOSTNAME", "LIVENESS"))
        for node in (steady, silent):
            # Online, or already stale: the watch's start (seconds on a loaded box) can
            # outlast the 1.5 s threshold since the last heartbeat.
            row = watch.line(containing(node.node_id[:8]))
            assert " online " in row or " stale " in row, row
        # A liveness change: the silent node goes stale (the workers' sweep decides).
        # The steady one keeps beating, so only the silent one can be due.
        wait_until(
            lambda: (
                beat(client, steady).status_code == 200
                and any(
                    t.node_id == silent.node_id and t.current == "stale"
                    for t in sweep_once(api, NO_BREAKER)
                )
            ),
            SWEPT_S,
            "the silent node swept stale",
        )
        changed = EventType.NODE_LIVENESS_CHANGED.value
        line = watch.line(containing(changed, silent.node_id[:8]))
        # The row: time, action, the node, then its liveness and hostname as of now.
        assert line.endswith(f"{silent.node_id[:8]}  stale silent-node"), line
        # A node change by another operator action.
        assert patch_node(client, api, steady.node_id, enabled=False).status_code == 200
        disabled = EventType.NODE_DISABLED.value
        line = watch.line(containing(disabled, steady.node_id[:8]))
        assert line.endswith(f"{steady.node_id[:8]}  disabled steady-node"), line
        assert watch.process.poll() is None, "a watch runs until it is stopped"
    # A wrong key: refused before anything is drawn, in one line, not retried forever.
    denied = admin("nodes", "list", "-w", key="not-the-operator-key")
    failed(denied, "admin_token_invalid")


def test_fleet_acknowledge_releases_the_partition_hold(admin: Admin, api: RunningApi) -> None:
    with api.client() as client:
        nodes = [enroll(client, api, f"rack7-{i}") for i in range(BREAKER.min_nodes)]
        for node in nodes:
            online(client, api, node)

    def suspected() -> FleetSafety | None:
        sweep_once(api, BREAKER)
        safety = FleetSafety.model_validate_json(ok(admin("fleet", "status", "--json")))
        return safety if safety.partition_hold else None

    # Every node silent at once: a partition is suspected, offline transitions are held.
    safety = wait_until(suspected, SWEPT_S, "the partition hold")
    assert safety.open_incident is not None and safety.open_incident.acknowledged_at is None
    incident = str(safety.open_incident.id)
    # The reason is required (it is audited): a usage error, before any request.
    missing = admin("fleet", "acknowledge", incident)
    assert missing.returncode == 2 and "--reason" in missing.stderr
    assert "Traceback" not in missing.stderr
    acknowledged = FleetIncidentInfo.model_validate_json(
        ok(admin("fleet", "acknowledge", incident, "--reason", "rack 7 lost power", "--json"))
    )
    assert str(acknowledged.id) == incident and acknowledged.acknowledged_at is not None
    assert acknowledged.acknowledged_reason == "rack 7 lost power"
    # Idempotent: the table shows the first acknowledgement, not the second reason.
    again = ok(admin("fleet", "acknowledge", incident, "--reason", "twice"))
    assert incident[:8] in again and "rack 7 lost power" in again and "twice" not in again
    listed = FleetIncidentList.model_validate_json(ok(admin("fleet", "incidents", "--json")))
    assert [(str(i.id), i.acknowledged_reason) for i in listed.items] == [
        (incident, "rack 7 lost power")
    ]
    # Released: the silent nodes go offline on the usual thresholds.
    with api.client() as client:

        def all_offline() -> bool:
            sweep_once(api, BREAKER)
            return all(get_node(client, api, n.node_id)["liveness"] == "offline" for n in nodes)

        wait_until(all_offline, SWEPT_S, "the silent nodes offline")
    offline = NodeList.model_validate_json(
        ok(admin("nodes", "list", "--liveness", "offline", "--json"))
    )
    assert {str(n.id) for n in offline.items} == {n.node_id for n in nodes}
    failed(
        admin("fleet", "acknowledge", str(uuid.uuid4()), "--reason", "no such incident"),
        "not_found",
    )

    # Offline nodes leave the watched set, so the incident resolves by itself; a late
    # acknowledgement is then a conflict.
    def resolved() -> bool:
        sweep_once(api, BREAKER)
        with api.client() as client:
            body = client.get(FLEET, headers=api.admin_headers).json()
        return body["open_incident"] is None

    wait_until(resolved, SWEPT_S, "the incident resolved")
    failed(admin("fleet", "acknowledge", incident, "--reason", "late"), "state_conflict")


def test_tokens_create_node_rebinds_the_identity(admin: Admin, api: RunningApi) -> None:
    with api.client() as client:
        node = enroll(client, api, "before-reinstall")
        recovery = EnrollmentTokenCreated.model_validate_json(
            ok(admin("tokens", "create", "--node", node.node_id, "--json"))
        )
        assert str(recovery.token.node_id) == node.node_id
        assert recovery.secret.startswith("mfe.")
        # Without --json: the table names the node; the secret alone on the last line.
        shown = ok(admin("tokens", "create", "--node", node.node_id, "--name", "again"))
        assert node.node_id[:8] in shown and shown.strip().splitlines()[-1].startswith("mfe.")
        # The reinstalled host enrolls with it: the same node, a new credential.
        response = client.post(ENROLL, json=enroll_body(recovery.secret, "after-reinstall"))
        assert response.status_code == 201, response.text
        assert response.json()["node_id"] == node.node_id
        refused(beat(client, node), 401, "credential_revoked")
        rebound = EnrolledNode(node.node_id, response.json()["credential"])
        assert beat(client, rebound).status_code == 200
    detail = NodeDetail.model_validate_json(ok(admin("nodes", "get", node.node_id, "--json")))
    assert detail.hostname == "after-reinstall" and detail.liveness is not Liveness.DECOMMISSIONED
    # No such node: the API's 404 as one line.
    failed(admin("tokens", "create", "--node", str(uuid.uuid4())), "not_found")
    # A decommissioned node is never re-bound.
    ok(admin("nodes", "decommission", node.node_id, "--yes"))
    failed(admin("tokens", "create", "--node", node.node_id), "node_terminal")
    # Not a node id at all: typer's usage line, before any request.
    malformed = admin("tokens", "create", "--node", "rack-7")
    assert malformed.returncode == 2 and "--node" in malformed.stderr
    assert "Traceback" not in malformed.stderr
