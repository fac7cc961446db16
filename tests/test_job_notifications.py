"""Job notifications relayed by the API: created through one API process, heard on a
channel held by another, over the real relay and NATS; only by the node whose job it
is. Two real `modelforge api` processes on one database."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agent.client import ProtocolClient, make_http_client
from agent.jobs.wakeups import Wakeups, listen
from schemas.jobs import JobKind
from schemas.protocol import (
    ARTIFACT_JOBS,
    ARTIFACT_JOBS_NEXT,
    INVENTORY,
    NOTIFICATIONS,
    RUNTIME_JOBS,
)
from tests.api_processes import ADMIN, REFUSALS, api_processes, enrolled, refuse
from tests.artifact_flows import MANIFEST, ROOT
from tests.flows import EnrolledNode, inventory_body
from tests.held_channel import channel
from tests.pipeline import RunningPipeline
from tests.runtime_flows import report_runtime

KEEPALIVE_S = 0.5
ARTIFACT_KIND = JobKind.ARTIFACT_ACQUIRE.value


@pytest.fixture
def two_apis(database_url: str, pipeline: RunningPipeline, tmp_path: Path) -> Iterator[list[str]]:
    # The relay publishes to the pipeline's NATS: both APIs listen there.
    assert pipeline.nats_url is not None
    # A short keep-alive: a refused node's channel closes within it.
    with api_processes(
        2, database_url, pipeline.nats_url, tmp_path, notification_keepalive_s=str(KEEPALIVE_S)
    ) as started:
        yield [url for url, _ in started]


def node_offering_roots(operator: httpx.Client, hostname: str) -> tuple[str, str]:
    node_id, credential = enrolled(operator, hostname)
    body = inventory_body(node_id, 1, hostname=hostname)
    body["host"]["artifact_roots"] = [ROOT]
    auth = {"Authorization": f"Bearer {credential}"}
    assert operator.put(INVENTORY, json=body, headers=auth).status_code == 200
    return node_id, credential


async def test_a_job_created_through_one_api_wakes_the_node_on_another(
    two_apis: list[str],
) -> None:
    creating, listening = two_apis
    with httpx.Client(base_url=creating, timeout=10) as operator:
        node_id, credential = node_offering_roots(operator, "notified")
        other_id, other_credential = node_offering_roots(operator, "bystander")
        async with (
            channel(listening, credential) as mine,
            channel(listening, other_credential) as theirs,
        ):
            # Both channels are registered before the job exists: `channel` returns once
            # the first line arrived, which the API sends after registering the node.
            job = operator.post(
                ARTIFACT_JOBS,
                json={"node_id": node_id, "target_root": ROOT, "manifest": MANIFEST},
                headers=ADMIN,
            )
            assert job.status_code == 201, job.text
            job_id = job.json()["id"]
            note = await asyncio.wait_for(mine.notes.get(), 10)
            assert note == {"event": "job.created", "job_id": job_id, "kind": ARTIFACT_KIND}
            # The wake-up leads to the claim, through either API.
            auth = {"Authorization": f"Bearer {credential}"}
            with httpx.Client(base_url=listening, timeout=10) as agent:
                claim = agent.get(ARTIFACT_JOBS_NEXT, headers=auth)
            assert claim.status_code == 200 and claim.json()["job_id"] == job_id
            cancel = operator.post(f"{ARTIFACT_JOBS}/{job_id}/cancel", headers=ADMIN)
            assert cancel.status_code == 200, cancel.text
            note = await asyncio.wait_for(mine.notes.get(), 10)
            assert note == {
                "event": "job.cancel_requested",
                "job_id": job_id,
                "kind": ARTIFACT_KIND,
            }
            # The other node heard nothing of it (a window for what must not arrive).
            await asyncio.sleep(0.5)
            assert theirs.notes.empty()
    assert other_id != node_id


async def test_a_notification_wakes_only_the_loop_for_its_kind(two_apis: list[str]) -> None:
    """The node's listener (agent/jobs/wakeups.py) over the real relay: an artifact job
    wakes the artifact loop and not the runtime loop, a runtime job the other way."""
    creating, listening = two_apis
    with httpx.Client(base_url=creating, timeout=10) as operator:
        node_id, credential = node_offering_roots(operator, "two-loops")
        # A runtime job needs a device the node's runtime worker reported.
        reported = report_runtime(operator, EnrolledNode(node_id, credential))
        assert reported.status_code == 200, reported.text
        wakeups = Wakeups()
        artifact = wakeups.loop_for([JobKind.ARTIFACT_ACQUIRE])
        runtime = wakeups.loop_for([JobKind.RUNTIME_PROBE, JobKind.RUNTIME_HEALTH])
        stop = asyncio.Event()
        async with make_http_client(listening, trust_env=False) as http:
            listener = asyncio.create_task(listen(ProtocolClient(http, credential), wakeups, stop))
            try:
                # Connected (and registered): every loop claims once, then only its kind.
                await asyncio.wait_for(artifact.wait(), 10)
                await asyncio.wait_for(runtime.wait(), 10)
                artifact.clear()
                runtime.clear()
                body = {"node_id": node_id, "target_root": ROOT, "manifest": MANIFEST}
                job = operator.post(ARTIFACT_JOBS, json=body, headers=ADMIN)
                assert job.status_code == 201, job.text
                await asyncio.wait_for(artifact.wait(), 10)
                # Both are decided by the same note, so nothing is left to arrive.
                assert not runtime.is_set()
                artifact.clear()
                body = {"kind": JobKind.RUNTIME_HEALTH.value, "node_id": node_id,
                        "device_id": "cpu"}  # fmt: skip
                job = operator.post(RUNTIME_JOBS, json=body, headers=ADMIN)
                assert job.status_code == 201, job.text
                await asyncio.wait_for(runtime.wait(), 10)
                assert not artifact.is_set()
            finally:
                stop.set()
                listener.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await listener


def test_the_channel_refuses_without_a_valid_credential(two_apis: list[str]) -> None:
    with httpx.Client(base_url=two_apis[1], timeout=10) as client:
        missing = client.get(NOTIFICATIONS)
        assert missing.status_code == 401 and missing.json()["code"] == "credential_missing"
        wrong = client.get(NOTIFICATIONS, headers={"Authorization": "Bearer nonsense"})
        assert wrong.status_code == 401
        assert wrong.headers["X-Correlation-ID"]


@pytest.mark.parametrize("change", [change for change, _, _ in REFUSALS])
async def test_a_refused_nodes_channel_closes_within_a_keepalive(
    two_apis: list[str], change: str
) -> None:
    creating, listening = two_apis
    with httpx.Client(base_url=creating, timeout=10) as operator:
        node_id, credential = node_offering_roots(operator, f"refused-{change}")
        async with channel(listening, credential) as held:
            # Open across several keep-alives while the node is in good standing.
            await asyncio.sleep(KEEPALIVE_S * 3)
            assert not held.closed.is_set()
            refuse(operator, node_id, change)
            await asyncio.wait_for(held.closed.wait(), KEEPALIVE_S * 4)
        with httpx.Client(base_url=listening, timeout=10) as agent:
            again = agent.get(NOTIFICATIONS, headers={"Authorization": f"Bearer {credential}"})
        assert again.status_code in (401, 403), again.text


async def test_a_held_channel_ends_as_soon_as_its_api_begins_to_stop(
    database_url: str, pipeline: RunningPipeline, tmp_path: Path
) -> None:
    """uvicorn waits for open connections before it stops, and a held channel never ends
    by itself: the API ends every one when it begins to stop, so it stops at once and
    the agent reconnects elsewhere."""
    assert pipeline.nats_url is not None
    with api_processes(1, database_url, pipeline.nats_url, tmp_path) as [(url, proc)]:
        with httpx.Client(base_url=url, timeout=10) as operator:
            _, credential = enrolled(operator, "held-at-shutdown")
        async with channel(url, credential) as held:
            began = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(held.closed.wait(), 5)
            status = await asyncio.to_thread(proc.wait, 10)
            took = time.monotonic() - began
        # uvicorn raises SIGTERM again once it has stopped gracefully.
        assert status == -signal.SIGTERM, (tmp_path / "api-0.log").read_text()
        # Well inside the keep-alive (15 s) and up's patience with a child (40 s).
        assert took < 5, f"the API took {took:.1f}s to stop"
