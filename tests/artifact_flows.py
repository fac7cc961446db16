"""Artifact-job steps shared by tests: an operator creating jobs, a node claiming and
reporting under its lease, over real HTTP."""

from __future__ import annotations

import hashlib
from typing import Any

import httpx

from schemas.protocol import (
    ARTIFACT_JOB_COMPLETE,
    ARTIFACT_JOB_FAIL,
    ARTIFACT_JOB_PROGRESS,
    ARTIFACT_JOBS,
    ARTIFACT_JOBS_NEXT,
    INVENTORY,
)
from tests.api_server import RunningApi
from tests.flows import EnrolledNode, enroll, inventory_body

ROOT = "/srv/models"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPOSITORY = "acme/tiny-model"


def content(name: str, size: int) -> bytes:
    """Deterministic file content of `size` bytes."""
    block = hashlib.sha256(name.encode()).digest()
    return (block * (size // len(block) + 1))[:size]


def file_entry(path: str, data: bytes) -> dict[str, Any]:
    return {
        "path": path,
        "size": len(data),
        "digest": {"algorithm": "sha256", "value": hashlib.sha256(data).hexdigest()},
    }


FILES = {
    "config.json": content("config.json", 300),
    "model.gguf": content("model.gguf", 4000),
}
MANIFEST: dict[str, Any] = {
    "repository": REPOSITORY,
    "commit": COMMIT,
    "files": [file_entry(path, data) for path, data in FILES.items()],
}


def node_with_roots(
    client: httpx.Client,
    api: RunningApi,
    hostname: str = "gpu-host-1",
    roots: list[str] | None = None,
) -> EnrolledNode:
    """An enrolled node whose inventory offers artifact roots."""
    node = enroll(client, api, hostname=hostname)
    offer_roots(client, node, [ROOT] if roots is None else roots, hostname=hostname)
    return node


def offer_roots(
    client: httpx.Client,
    node: EnrolledNode,
    roots: list[str],
    *,
    sequence: int = 1,
    hostname: str = "gpu-host-1",
) -> None:
    """The node's agent reports these artifact roots in its inventory."""
    body = inventory_body(node.node_id, sequence, hostname=hostname)
    body["host"]["artifact_roots"] = roots
    response = client.put(INVENTORY, json=body, headers=node.headers)
    assert response.status_code == 200, response.text


def create_job(
    client: httpx.Client, api: RunningApi, node: EnrolledNode, **overrides: Any
) -> httpx.Response:
    """An override of None leaves that field out (e.g. manifest=None, resolve=...)."""
    body: dict[str, Any] = {"node_id": node.node_id, "target_root": ROOT, "manifest": MANIFEST}
    body.update(overrides)
    body = {key: value for key, value in body.items() if value is not None}
    return client.post(ARTIFACT_JOBS, json=body, headers=api.admin_headers)


def created(client: httpx.Client, api: RunningApi, node: EnrolledNode, **overrides: Any) -> str:
    response = create_job(client, api, node, **overrides)
    assert response.status_code == 201, response.text
    job_id: str = response.json()["id"]
    return job_id


def get_job(client: httpx.Client, api: RunningApi, job_id: str) -> dict[str, Any]:
    response = client.get(f"{ARTIFACT_JOBS}/{job_id}", headers=api.admin_headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def claim(client: httpx.Client, node: EnrolledNode) -> httpx.Response:
    return client.get(ARTIFACT_JOBS_NEXT, headers=node.headers)


def claimed(client: httpx.Client, node: EnrolledNode) -> dict[str, Any]:
    response = claim(client, node)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def fence(claim_body: dict[str, Any]) -> dict[str, Any]:
    lease = claim_body["lease"]
    return {"lease_id": lease["lease_id"], "epoch": lease["epoch"]}


def progress(
    client: httpx.Client, node: EnrolledNode, job_id: str, lease: dict[str, Any], done: int
) -> httpx.Response:
    body = {"lease": lease, "files": [{"path": "model.gguf", "bytes_done": done}]}
    return client.post(ARTIFACT_JOB_PROGRESS.format(job_id=job_id), json=body, headers=node.headers)


def complete(
    client: httpx.Client,
    node: EnrolledNode,
    job_id: str,
    lease: dict[str, Any],
    files: list[dict[str, Any]] | None = None,
) -> httpx.Response:
    body = {"lease": lease, "files": MANIFEST["files"] if files is None else files}
    return client.post(ARTIFACT_JOB_COMPLETE.format(job_id=job_id), json=body, headers=node.headers)


def fail(
    client: httpx.Client,
    node: EnrolledNode,
    job_id: str,
    lease: dict[str, Any],
    code: str,
    *,
    retryable: bool,
) -> httpx.Response:
    body = {"lease": lease, "code": code, "retryable": retryable, "detail": "from a test"}
    return client.post(ARTIFACT_JOB_FAIL.format(job_id=job_id), json=body, headers=node.headers)
