"""Artifact jobs end to end: a real agent process claims through the real API, downloads
from a real local server that speaks the Hub layout (tests/hub_server.py), verifies,
promotes and reports; observed through the admin API as an operator would."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from schemas.protocol import ARTIFACT_JOB_COMPLETE, ARTIFACT_JOBS, NODES
from stack.embedded_nats import EmbeddedNats
from tests.agent.artifact_agent import StartAgent, created, ended, start_agent
from tests.agent.harness import AgentProcess, admin, wait_until
from tests.agent.proxy import FaultProxy, Scripted
from tests.api_server import RunningApi
from tests.artifact_flows import content, file_entry
from tests.hub_server import HubServer
from tests.worker_processes import Workers

ApiFactory = Callable[..., RunningApi]

REPO = "acme/tiny-model"
COMMIT = "00112233445566778899aabbccddeeff00112233"
FILES = {
    "config.json": content("config.json", 300),
    "weights/model.gguf": content("model.gguf", 300_000),
}


@pytest.fixture
def job_api(api_factory: ApiFactory) -> RunningApi:
    return api_factory(job_lease_s=5, job_retry_base_s=0.2)


def manifest(files: dict[str, bytes] = FILES) -> dict[str, Any]:
    return {
        "repository": REPO,
        "commit": COMMIT,
        "files": [file_entry(path, data) for path, data in files.items()],
    }


def create(api: RunningApi, node_id: str, root: Path, **body: Any) -> str:
    job = created(
        api, {"node_id": node_id, "target_root": str(root), "manifest": manifest()} | body
    )
    job_id: str = job["id"]
    return job_id


def test_a_job_is_fetched_verified_promoted_and_recorded(
    job_api: RunningApi, agents: StartAgent, hub: HubServer, tmp_path: Path
) -> None:
    hub.state.add(REPO, "main", COMMIT, FILES)
    agent, node_id, root = start_agent(job_api, agents, hub, tmp_path)
    job = ended(job_api, create(job_api, node_id, root))
    assert job["state"] == "succeeded", job
    final = root / REPO / COMMIT
    for path, data in FILES.items():
        assert (final / path).read_bytes() == data
    assert not any((root / ".modelforge-staging").glob("*")), "staging is cleaned up"
    artifacts = admin(job_api, "GET", f"{NODES}/{node_id}/artifacts")["items"]
    assert [(a["repository"], a["commit"], a["root"]) for a in artifacts] == [
        (REPO, COMMIT, str(root))
    ]
    # The same files again: present with the right digest, so not downloaded again.
    downloads = len(hub.state.ranges)
    again = ended(job_api, create(job_api, node_id, root))
    assert again["state"] == "succeeded"
    assert len(hub.state.ranges) == downloads
    agent.wait_for_log(r"job .*: complete")


@contextlib.contextmanager
def completion_answered(
    answer: Scripted, api: RunningApi, agents: StartAgent, hub: HubServer, tmp_path: Path
) -> Iterator[tuple[FaultProxy, AgentProcess, str]]:
    """An agent behind a proxy that gives the first completion `answer`, and a job for
    it: (proxy, agent, job id)."""
    hub.state.add(REPO, "main", COMMIT, FILES)
    proxy = FaultProxy(api.base_url).start()
    try:
        proxy.script_matching(ARTIFACT_JOB_COMPLETE.format(job_id="[0-9a-f-]+"), answer)
        agent, node_id, root = start_agent(api, agents, hub, tmp_path, api_url=proxy.url)
        yield proxy, agent, create(api, node_id, root)
    finally:
        proxy.close()


def test_a_transient_refusal_of_the_completion_is_retried_within_the_lease(
    job_api: RunningApi, agents: StartAgent, hub: HubServer, tmp_path: Path
) -> None:
    """The API answers the first completion 503 (a proxy in front of it): the agent sends
    it again with backoff under the same lease, so the job succeeds on its first attempt
    with each file downloaded once, instead of waiting out the lease and running again."""
    unavailable = Scripted(503, "database_unavailable")
    with completion_answered(unavailable, job_api, agents, hub, tmp_path) as (proxy, agent, job_id):
        job = ended(job_api, job_id)
        assert job["state"] == "succeeded", job
        assert job["attempt"] == 1, "completed under its first lease"
        path = ARTIFACT_JOB_COMPLETE.format(job_id=job_id)
        assert [seen.status for seen in proxy.requests_to(path)] == [503, 200]
        assert sorted(name for name, _ in hub.state.ranges) == sorted(FILES), "one download"
        agent.wait_for_log(r"complete.*retrying in")


def test_a_stale_lease_refusing_the_completion_is_final(
    job_api: RunningApi, agents: StartAgent, hub: HubServer, tmp_path: Path
) -> None:
    """A 409 on the completion (the lease moved on) is not sent again."""
    stale = Scripted(409, "lease_stale")
    with completion_answered(stale, job_api, agents, hub, tmp_path) as (proxy, agent, job_id):
        agent.wait_for_log(r"the completion was not accepted .*status=409")
        path = ARTIFACT_JOB_COMPLETE.format(job_id=job_id)
        assert [seen.status for seen in proxy.requests_to(path)] == [409]
        assert "retrying in" not in agent.output


def test_a_resolved_manifest_end_to_end(
    api_factory: ApiFactory, agents: StartAgent, hub: HubServer, tmp_path: Path
) -> None:
    """Names the Hub accepts that the old narrow pattern dropped (spaces, non-ASCII,
    `~`, parentheses) are resolved, fetched and promoted like any other."""
    odd = {"weights/my model (1) ~ü.gguf": content("odd", 5000)}
    hub.state.add(REPO, "main", COMMIT, FILES | odd)
    api = api_factory(artifact_source_url=hub.url)
    _, node_id, root = start_agent(api, agents, hub, tmp_path)
    job = created(
        api,
        {
            "node_id": node_id,
            "target_root": str(root),
            "resolve": {"repository": REPO, "revision": "main", "patterns": ["weights/*"]},
        },
    )
    assert job["spec"]["commit"] == COMMIT
    assert ended(api, job["id"])["state"] == "succeeded"
    assert [f["path"] for f in job["spec"]["files"]] == sorted(["weights/model.gguf", *odd])
    assert (root / REPO / COMMIT / "weights/model.gguf").read_bytes() == FILES["weights/model.gguf"]
    for path, data in odd.items():
        assert (root / REPO / COMMIT / path).read_bytes() == data
    assert not (root / REPO / COMMIT / "config.json").exists()


def test_a_job_created_through_one_api_wakes_the_agent_listening_on_another(
    api_factory: ApiFactory, agents: StartAgent, hub: HubServer, tmp_path: Path
) -> None:
    """The notification path end to end: the operator's API commits the job, the relay
    publishes its event, the other API relays it down the agent's held channel, and the
    agent claims at once, although it would not poll again for two minutes."""
    hub.state.add(REPO, "main", COMMIT, FILES)
    creating, listening = api_factory(), api_factory()
    agent, node_id, root = start_agent(listening, agents, hub, tmp_path, job_poll_interval_s=120)
    agent.wait_for_log(r"job notifications: listening")
    time.sleep(0.5)  # the claim that the channel's opening triggers has found nothing
    job_id = create(creating, node_id, root)
    job = ended(creating, job_id, timeout_s=15)
    assert job["state"] == "succeeded", job
    assert job["attempt"] == 1
    agent.wait_for_log(rf"claimed artifact job {job_id}")


@pytest.mark.parametrize(
    ("fault", "code"),
    [
        ("checksum", "checksum_mismatch"),
        ("missing", "source_not_found"),
        ("reserve", "insufficient_space"),
        ("stall", "stalled"),
    ],
)
def test_failures_are_typed_and_leave_nothing_behind(
    job_api: RunningApi,
    agents: StartAgent,
    hub: HubServer,
    tmp_path: Path,
    fault: str,
    code: str,
) -> None:
    files = dict(FILES)
    body: dict[str, Any] = {"max_attempts": 1}
    if fault == "missing":
        hub.state.add(REPO, "main", COMMIT, {"config.json": FILES["config.json"]})
    else:
        hub.state.add(REPO, "main", COMMIT, files)
    if fault == "checksum":
        hub.state.corrupt["weights/model.gguf"] = content("something else", 300_000)
    if fault == "reserve":
        body["reserve"] = {"min_free_bytes": 2**52}  # 4 PiB must stay free
    if fault == "stall":
        hub.state.stall_after["weights/model.gguf"] = 100_000
    _, node_id, root = start_agent(job_api, agents, hub, tmp_path)
    job = ended(job_api, create(job_api, node_id, root, **body))
    assert job["state"] == "failed", job
    assert job["failure"]["code"] == code
    assert not (root / REPO / COMMIT / "weights/model.gguf").exists()
    # Even a retryable failure (stall) on the last attempt: nothing is left to resume.
    assert not any((root / ".modelforge-staging").rglob("*.gguf"))


def test_an_operator_cancel_stops_the_download(
    job_api: RunningApi, agents: StartAgent, hub: HubServer, tmp_path: Path
) -> None:
    hub.state.add(REPO, "main", COMMIT, FILES)
    hub.state.throttle["weights/model.gguf"] = 50_000  # six seconds for the file
    _, node_id, root = start_agent(job_api, agents, hub, tmp_path)
    job_id = create(job_api, node_id, root)
    wait_until(
        lambda: (
            (admin(job_api, "GET", f"{ARTIFACT_JOBS}/{job_id}").get("progress") or {}).get(
                "bytes_done", 0
            )
            > 0
        ),
        what="the download under way",
    )
    admin(job_api, "POST", f"{ARTIFACT_JOBS}/{job_id}/cancel")
    job = ended(job_api, job_id, timeout_s=10)
    assert job["state"] == "cancelled"
    assert not (root / REPO / COMMIT).exists()
    left = list((root / ".modelforge-staging").rglob("*"))
    assert not left, left


def test_progress_is_visible_with_rate_and_eta(
    job_api: RunningApi, agents: StartAgent, hub: HubServer, tmp_path: Path
) -> None:
    hub.state.add(REPO, "main", COMMIT, FILES)
    hub.state.throttle["weights/model.gguf"] = 100_000
    agent, node_id, root = start_agent(job_api, agents, hub, tmp_path)
    job_id = create(job_api, node_id, root)

    def moving() -> dict[str, Any] | None:
        progress = admin(job_api, "GET", f"{ARTIFACT_JOBS}/{job_id}").get("progress")
        return progress if progress and progress.get("bytes_per_s") else None

    progress = wait_until(moving, what="a rate in the admin view")
    assert 0 < progress["bytes_done"] < progress["bytes_total"] == 300_300
    assert progress["eta_s"] is not None and progress["eta_s"] > 0
    agent.wait_for_log(r"bytes, [\d.]+ MB/s, ETA \d+ s")
    assert ended(job_api, job_id)["state"] == "succeeded"


def slow_download_with_short_leases(
    api_factory: ApiFactory,
    agents: StartAgent,
    hub: HubServer,
    tmp_path: Path,
    workers: Workers,
    nats_server: EmbeddedNats,
) -> tuple[RunningApi, AgentProcess, Path, str]:
    """A job downloading a throttled file under 2 s leases that a worker expires at
    once: (api, agent, root, job id)."""
    workers.env.update(
        MODELFORGE_JOB_LEASE_S="2",
        MODELFORGE_JOB_RETRY_BASE_S="0.2",
        MODELFORGE_LEASE_SWEEP_PERIOD_S="0.2",
    )
    workers.start(1)
    api = api_factory(pipeline=False, nats_url=nats_server.url, job_lease_s=2, job_retry_base_s=0.2)
    hub.state.add(REPO, "main", COMMIT, FILES)
    hub.state.throttle["weights/model.gguf"] = 60_000
    agent, node_id, root = start_agent(api, agents, hub, tmp_path)
    job_id = create(api, node_id, root)
    return api, agent, root, job_id


def test_sigkill_mid_download_resumes_after_the_lease_expires(
    api_factory: ApiFactory,
    agents: StartAgent,
    hub: HubServer,
    tmp_path: Path,
    workers: Workers,
    nats_server: EmbeddedNats,
) -> None:
    """The agent dies mid-file; a worker expires its lease; the job's next attempt, on
    the restarted agent, resumes the staged part with a Range request."""
    api, agent, root, job_id = slow_download_with_short_leases(
        api_factory, agents, hub, tmp_path, workers, nats_server
    )

    def halfway() -> bool:
        progress = admin(api, "GET", f"{ARTIFACT_JOBS}/{job_id}").get("progress") or {}
        return int(progress.get("bytes_done", 0)) > 100_000

    wait_until(halfway, what="a third of the file")
    agent.kill()
    hub.state.throttle.clear()
    agents(tmp_path / "agent.yaml", tmp_path / "agent-restarted.log")
    job = ended(api, job_id, timeout_s=30)
    assert job["state"] == "succeeded" and job["attempt"] == 2, job
    assert (root / REPO / COMMIT / "weights/model.gguf").read_bytes() == FILES["weights/model.gguf"]
    resumed = [
        int(value.removeprefix("bytes=").rstrip("-"))
        for path, value in hub.state.ranges
        if path == "weights/model.gguf" and value
    ]
    assert resumed and resumed[-1] > 100_000, hub.state.ranges


def test_staging_of_a_job_cancelled_while_its_agent_was_stopped_is_swept(
    api_factory: ApiFactory,
    agents: StartAgent,
    hub: HubServer,
    tmp_path: Path,
    workers: Workers,
    nats_server: EmbeddedNats,
) -> None:
    """The agent stops mid-file; the operator cancels; a worker ends the job when its
    lease runs out. Nothing will resume it: the restarted agent removes its staging
    (asking the control plane), and leaves alone what is not a job's."""
    api, agent, root, job_id = slow_download_with_short_leases(
        api_factory, agents, hub, tmp_path, workers, nats_server
    )
    staging = root / ".modelforge-staging" / job_id
    not_a_job = root / ".modelforge-staging" / "operator-notes"
    not_a_job.mkdir(parents=True)

    def under_way() -> bool:
        progress = admin(api, "GET", f"{ARTIFACT_JOBS}/{job_id}").get("progress") or {}
        return int(progress.get("bytes_done", 0)) > 60_000

    wait_until(under_way, what="the download under way")
    assert agent.stop() == 0
    admin(api, "POST", f"{ARTIFACT_JOBS}/{job_id}/cancel")
    assert ended(api, job_id)["state"] == "cancelled"
    assert any(staging.rglob("*.gguf")), "the stopped agent left its partial file"
    restarted = agents(tmp_path / "agent.yaml", tmp_path / "agent-restarted.log")
    restarted.wait_for_log(rf"removed the staging of job {job_id} \(the job will not be resumed\)")
    assert not staging.exists()
    assert not_a_job.is_dir()
