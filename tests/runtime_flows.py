"""Runtime steps shared by tests, over real HTTP: a node whose runtime worker reported
a binary and whose artifact inventory holds a file, profiles, probes and their reports."""

from __future__ import annotations

import hashlib
from typing import Any

import httpx

from schemas.protocol import (
    RUNTIME,
    RUNTIME_ENVIRONMENTS,
    RUNTIME_JOB_COMPLETE,
    RUNTIME_JOB_FAIL,
    RUNTIME_JOB_PROGRESS,
    RUNTIME_JOBS,
    RUNTIME_JOBS_NEXT,
    RUNTIME_PROFILES,
)
from tests.api_server import RunningApi
from tests.artifact_flows import (
    COMMIT,
    FILES,
    REPOSITORY,
    ROOT,
    claimed,
    complete,
    created,
    fence,
    node_with_roots,
)
from tests.flows import EnrolledNode, now

BINARY_SHA256 = hashlib.sha256(b"llama-server").hexdigest()
GGUF = "model.gguf"


def runtime_report(node: EnrolledNode, sequence: int, **extra: Any) -> dict[str, Any]:
    return {
        "node_id": node.node_id,
        "sequence": sequence,
        "observed_at": now().isoformat(),
        "devices": [{"device_id": "cpu", "backend": "cpu", "queue_depth": 0}],
        "served_models": [{"model_id": "smol", "roles": ["planner"]}],
        "loaded_models": [],
        "environments": [{"binary_sha256": BINARY_SHA256, "version": "b1", "backend": "cpu"}],
        **extra,
    }


def report_runtime(
    client: httpx.Client, node: EnrolledNode, sequence: int = 1, **extra: Any
) -> httpx.Response:
    return client.put(RUNTIME, json=runtime_report(node, sequence, **extra), headers=node.headers)


def acquire(client: httpx.Client, api: RunningApi, node: EnrolledNode) -> None:
    """The node's artifact inventory gets FILES (an artifact job, claimed and completed)."""
    created(client, api, node)
    job = claimed(client, node)
    answer = complete(client, node, job["job_id"], fence(job))
    assert answer.status_code == 200 and answer.json()["state"] == "succeeded", answer.text


def ready_node(client: httpx.Client, api: RunningApi, hostname: str = "gpu-host-1") -> EnrolledNode:
    """A node with the artifact file in its inventory and a reported binary."""
    node = node_with_roots(client, api, hostname=hostname)
    acquire(client, api, node)
    assert report_runtime(client, node).status_code == 200
    return node


def environment_id(client: httpx.Client, api: RunningApi) -> str:
    response = client.get(RUNTIME_ENVIRONMENTS, headers=api.admin_headers)
    assert response.status_code == 200, response.text
    [found] = [e for e in response.json()["items"] if e["binary_sha256"] == BINARY_SHA256]
    value: str = found["id"]
    return value


def create_profile(
    client: httpx.Client, api: RunningApi, name: str = "small", **settings: Any
) -> dict[str, Any]:
    body = {"name": name, "settings": {"ctx_size": 512, "threads": 2, **settings}}
    response = client.post(RUNTIME_PROFILES, json=body, headers=api.admin_headers)
    assert response.status_code == 201, response.text
    profile: dict[str, Any] = response.json()
    return profile


def probe_body(
    node: EnrolledNode, profile_id: str, environment: str, **extra: Any
) -> dict[str, Any]:
    artifact = {"repository": REPOSITORY, "commit": COMMIT, "path": GGUF}
    return {"node_id": node.node_id, "artifact": artifact, "profile_id": profile_id,
            "environment_id": environment, **extra}  # fmt: skip


def create_probe(client: httpx.Client, api: RunningApi, body: dict[str, Any]) -> httpx.Response:
    return client.post(RUNTIME_JOBS, json=body, headers=api.admin_headers)


def runtime_job(client: httpx.Client, api: RunningApi, job_id: str) -> dict[str, Any]:
    """A runtime job of any kind, as an operator sees it."""
    response = client.get(f"{RUNTIME_JOBS}/{job_id}", headers=api.admin_headers)
    assert response.status_code == 200, response.text
    view: dict[str, Any] = response.json()
    return view


def claim_runtime_job(client: httpx.Client, node: EnrolledNode) -> httpx.Response:
    return client.get(RUNTIME_JOBS_NEXT, headers=node.headers)


def evidence_report(lease: dict[str, Any]) -> dict[str, Any]:
    return {
        "lease": lease,
        "device_id": "cpu",
        "health": {"process_up": True, "health_ok": True, "model_listed": True,
                   "inference_ok": True},
        "evidence": {"load_s": 0.4, "time_to_first_token_s": 0.05,
                     "prompt_tokens_per_s": 300.0, "generation_tokens_per_s": 60.0,
                     "peak_rss_bytes": 200_000_000},
    }  # fmt: skip


def complete_probe(
    client: httpx.Client, node: EnrolledNode, job_id: str, lease: dict[str, Any]
) -> httpx.Response:
    path = RUNTIME_JOB_COMPLETE.format(job_id=job_id)
    return client.post(path, json=evidence_report(lease), headers=node.headers)


def probe_progress(
    client: httpx.Client, node: EnrolledNode, job_id: str, lease: dict[str, Any], phase: str
) -> httpx.Response:
    path = RUNTIME_JOB_PROGRESS.format(job_id=job_id)
    return client.post(path, json={"lease": lease, "phase": phase}, headers=node.headers)


def fail_runtime_job(
    client: httpx.Client, node: EnrolledNode, job_id: str, lease: dict[str, Any], code: str,
    *, retryable: bool,
) -> httpx.Response:  # fmt: skip
    body = {"lease": lease, "code": code, "retryable": retryable, "detail": "from a test"}
    return client.post(RUNTIME_JOB_FAIL.format(job_id=job_id), json=body, headers=node.headers)


ARTIFACT_PATH = f"{ROOT}/{REPOSITORY}/{COMMIT}/{GGUF}"
ARTIFACT_SHA256 = hashlib.sha256(FILES[GGUF]).hexdigest()
