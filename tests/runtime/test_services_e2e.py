"""A model service for real (issue 32, "Testing it for real"): a worker process running
the service reconciler, the API, three nodes (each an agent and a runtime worker with a
real llama-server on its CPU) and the official `openai` client under a steady load
(tests/runtime/steady_load.py: retries as the client does by default, max_retries=2;
short answers, streamed and plain in turn), while the service

1. scales 1 -> 2 -> 1: the second replica acquired (an artifact job, from the local Hub)
   and loaded on another node, then one drained;
2. rolls out to another runtime profile: the new replica ready before the old drains;
3. at 2 replicas, loses a node (agent, runtime worker and its llama-server SIGKILLed):
   the other replica keeps serving, and the lost one is replaced on the third node;
4. gets that node back: its replica (reloaded there by the deployment reconciler) is a
   surplus now, and is drained.

What is asserted, precisely, over the whole run (between the phases too):
* zero failed requests after the client's own retries, and zero streams that ended
  without a finish_reason, except streams the killed node was already sending at the
  kill (a stream under way cannot be moved: the gateway ends it with its typed
  `node_lost` event, which the client raises mid-iteration); their number is printed;
* every replica that left (scaled down, replaced by the rollout, the surplus of the
  returned node) ended with a drain whose job reports 0 invokes cut;
* each new replica's receipt names the node it went to, and where that node lacked the
  model (the first replica's always) its artifact job brought it there before the load;
* the replacement is ready, then serving, within a bound; both times are printed.

Three nodes, not two: with two and two replicas (at most one per node) a replacement has
nowhere to go, and with one replica there is a gap with no replica ready (the offline
threshold, the heal grace and the load) longer than the client's retries cover. The
third node is the place a healed replica goes while the other keeps serving.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import pytest

from tests.agent.harness import wait_until
from tests.runtime.service_fleet import ServiceFleet, service_fleet
from tests.runtime.steady_load import Outcome, SteadyLoad, summary

__all__ = ["service_fleet"]

pytestmark = pytest.mark.slow

MODEL = "smol-service"
# A replica's placement, acquisition and load on a loaded two-core box.
PLACED_S = 120
# Offline threshold (4 s) + heal grace (1 s) + a sweep + acquisition + load, with room.
HEALED_S = 150


def ready_on(detail: dict[str, Any]) -> dict[str, str]:
    """node id -> replica id of the ready replicas."""
    return {r["node_id"]: r["id"] for r in detail["items"] if r["phase"] == "ready"}


def rolled_out(generation: int, detail: dict[str, Any]) -> bool:
    """The rollout complete: one replica, ready, of that generation."""
    replicas = detail["items"]
    current = [r for r in replicas if r["phase"] == "ready" and r["generation"] == generation]
    return detail["rollout"]["state"] == "complete" and len(current) == len(replicas) == 1


def deployments_of(detail: dict[str, Any]) -> dict[str, str]:
    """replica id -> deployment id of the live replicas."""
    return {r["id"]: r["deployment_id"] for r in detail["items"] if r["deployment_id"]}


def placed_with_its_model(fleet: ServiceFleet, replica: dict[str, Any]) -> dict[str, Any]:
    """The replica's receipt names the node it went to; where that node lacked the model,
    the replica's artifact job brought it there (from the local Hub) before the load."""
    receipt: dict[str, Any] = replica["receipt"]
    assert receipt["outcome"] == "placed" and receipt["node_id"] == replica["node_id"], replica
    if not receipt["holds_artifact"]:
        job = fleet.artifact_job(replica["artifact_job_id"])
        assert (job["state"], job["node_id"]) == ("succeeded", replica["node_id"]), job
    return receipt


def drained_without_a_cut(fleet: ServiceFleet, deployment_id: str) -> dict[str, Any]:
    """The replica's deployment once unloaded, and the result of the drain that ended it:
    it must report every invoke finished, none cut."""
    wait_until(
        lambda: fleet.deployment(deployment_id)["state"] == "unloaded",
        60,
        f"deployment {deployment_id} unloaded after its drain",
    )
    drains = [j for j in fleet.deployment_jobs(deployment_id) if j["kind"] == "deployment.drain.v1"]
    assert drains, f"deployment {deployment_id} ended without a drain"
    result: dict[str, Any] = drains[0]["result"]
    assert drains[0]["state"] == "succeeded" and result["cut"] == 0, drains[0]
    return result


def no_failures(load: SteadyLoad, phase: tuple[float, float], name: str) -> list[Outcome]:
    done = load.between(*phase)
    assert done, f"no request ran during {name}"
    assert all(o.ok for o in done), f"{name}: {summary(done)}"
    return done


def test_a_service_scales_rolls_out_and_heals_under_steady_load(
    service_fleet: ServiceFleet,
) -> None:
    fleet = service_fleet
    fleet.start_nodes("a", "b", "c")
    small = fleet.profile("svc-small", ctx_size=512)
    larger = fleet.profile("svc-larger", ctx_size=1024)
    strategy = {"max_surge": 1, "max_unavailable": 0, "drain_deadline_s": 30}
    created = fleet.create_service(
        MODEL, small, replicas=1, placement={"device_kind": "cpu"}, strategy=strategy
    )
    service_id = created["id"]
    first = fleet.until_ready(service_id, 1, PLACED_S)
    load = SteadyLoad(fleet.api.base_url, fleet.client_secret(MODEL), MODEL).start()
    phases: dict[str, tuple[float, float]] = {}
    try:
        [first_node] = ready_on(first)
        # No node had the model: the first replica's node acquired it first.
        assert not placed_with_its_model(fleet, first["items"][0])["holds_artifact"]
        wait_until(lambda: load.served_by(first_node, 0), 60, "the load served")

        # 1. 1 -> 2 -> 1: both replicas serve, then one drains without a cut.
        with load.phase("scale", phases):
            fleet.scale(service_id, 2)
            two = fleet.until_ready(service_id, 2, PLACED_S)
            for replica in two["items"]:
                placed_with_its_model(fleet, replica)
            since = time.monotonic()
            for node_id in ready_on(two):
                wait_until(partial(load.served_by, node_id, since), 60, f"{node_id} serving")
            fleet.scale(service_id, 1)
            one = fleet.until_ready(service_id, 1, PLACED_S)
        [drained] = set(deployments_of(two)) - set(deployments_of(one))
        drained_without_a_cut(fleet, deployments_of(two)[drained])
        no_failures(load, phases["scale"], "the scale 1 -> 2 -> 1")

        # 2. A rollout to the larger profile: one surge replica, then the old one drains.
        old = deployments_of(one)
        with load.phase("rollout", phases):
            rolled = fleet.rollout(service_id, profile_id=larger)
            generation = rolled["generation"]
            done = fleet.until_service(
                service_id, partial(rolled_out, generation), PLACED_S, "the rollout complete"
            )
        assert done["template"]["profile_id"] == larger
        placed_with_its_model(fleet, done["items"][0])
        for deployment_id in old.values():
            drained_without_a_cut(fleet, deployment_id)
        no_failures(load, phases["rollout"], "the rollout")

        # 3. Two replicas; one node lost; the other serves while the third takes over.
        fleet.scale(service_id, 2)
        pair = fleet.until_ready(service_id, 2, PLACED_S)
        holding = ready_on(pair)
        [spare] = [n for n in fleet.nodes.values() if n.node_id not in holding]
        victim, survivor = (fleet.by_id(node_id) for node_id in holding)
        since = time.monotonic()
        wait_until(lambda: load.served_by(survivor.node_id, since), 60, "the survivor serving")
        with load.phase("kill", phases):
            victim.kill()
            killed = time.monotonic()
            fleet.until_service(
                service_id,
                lambda s: spare.node_id in ready_on(s) and survivor.node_id in ready_on(s),
                HEALED_S,
                f"a replica ready on the spare node {spare.name} beside the survivor",
            )
            healed = time.monotonic()
            replacement = next(
                r for r in fleet.service(service_id)["items"] if r["node_id"] == spare.node_id
            )
            placed_with_its_model(fleet, replacement)
            wait_until(lambda: load.served_by(spare.node_id, healed), 60, "the spare serving")
            serving = time.monotonic()
        lost = {r["id"]: r["deployment_id"] for r in fleet.service(service_id)["items"]
                if r["node_id"] == victim.node_id}  # fmt: skip

        # 4. The lost node returns: its replica, a surplus now, is drained, never cut.
        with load.phase("return", phases):
            fleet.restart(victim)
            fleet.until_service(
                service_id,
                lambda s: (
                    not set(lost) & {r["id"] for r in s["items"]}
                    and set(ready_on(s)) == {survivor.node_id, spare.node_id}
                ),
                PLACED_S,
                "the lost node's replica ended, the two others ready",
            )
        for deployment_id in lost.values():
            drained_without_a_cut(fleet, deployment_id)
    finally:
        load.stop()

    during = load.between(*phases["kill"])
    everything = load.between(0, float("inf"))
    # Between the phases too (the scale to 2 before the kill, the warm-up): nothing fails.
    failed = [o for o in everything if not o.ok]
    # A stream the killed node was sending cannot be moved; anything else must not fail.
    cut_by_kill = [
        o for o in failed
        if o.stream and o.after_first_chunk and o.node == victim.node_id
        and o.code == "node_lost" and o.started < killed
    ]  # fmt: skip
    assert failed == cut_by_kill, f"the whole run: {summary(everything)}\nphases: {phases}"
    assert sum(1 for o in during if o.ok and o.started > killed) > 0
    took = {name: f"{end - start:.1f} s" for name, (start, end) in phases.items()}
    print(
        f"\nservices e2e: {len(everything)} requests "
        f"({sum(1 for o in everything if o.stream)} streamed), "
        f"{sum(1 for o in everything if not o.ok)} failed, "
        f"{load.retried_between(0, float('inf'))} answers >= 400 retried by the client; "
        f"phases {took}; node lost -> replacement ready {healed - killed:.1f} s, "
        f"-> serving {serving - killed:.1f} s; "
        f"streams cut by the node's loss: {len(cut_by_kill)}"
    )
