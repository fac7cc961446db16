"""A real agent process offering an artifact root, and artifact jobs it runs, observed
through the admin API: shared by the agent's artifact tests and the runtime's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from schemas.protocol import ARTIFACT_JOBS, NODES
from tests.agent.harness import AgentProcess, admin, identity, new_token, wait_until, write_config
from tests.api_server import RunningApi
from tests.hub_server import HubServer

StartAgent = Callable[..., AgentProcess]


def start_agent(
    api: RunningApi, agents: StartAgent, hub: HubServer, tmp_path: Path, **config: Any
) -> tuple[AgentProcess, str, Path]:
    """An enrolled agent offering one artifact root: (process, node id, root)."""
    root = tmp_path / "models"
    root.mkdir(exist_ok=True)
    state = tmp_path / "state"
    settings: dict[str, Any] = {
        "api_url": api.base_url,
        "state_dir": str(state),
        "enrollment_token": new_token(api),
        "hostname": "gpu-artifacts",
        "collector": "none",
        "artifact_roots": [str(root)],
        "artifact_source_url": hub.url,
        "job_poll_interval_s": 0.3,
        "artifact_progress_interval_s": 0.2,
        "artifact_stall_s": 1.5,
    }
    settings.update(config)
    path = write_config(tmp_path / "agent.yaml", **settings)
    agent = agents(path)
    agent.wait_for_log(r"enrolled as node|resuming as node")
    node_id = identity(state)["node_id"]
    wait_until(lambda: _offers(api, node_id, str(root)), what="the root in the inventory")
    return agent, node_id, root


def _offers(api: RunningApi, node_id: str, root: str) -> bool:
    detail = admin(api, "GET", f"{NODES}/{node_id}")
    inventory = detail.get("inventory") or {}
    return root in (inventory.get("host") or {}).get("artifact_roots", [])


def created(api: RunningApi, body: dict[str, Any]) -> dict[str, Any]:
    with api.client() as client:
        response = client.post(ARTIFACT_JOBS, json=body, headers=api.admin_headers)
    assert response.status_code == 201, response.text
    job: dict[str, Any] = response.json()
    return job


def ended(
    api: RunningApi, job_id: str, timeout_s: float = 30, *, collection: str = ARTIFACT_JOBS
) -> dict[str, Any]:
    """The job (an artifact job, or of `collection`, e.g. RUNTIME_JOBS) once it ended."""

    def finished() -> dict[str, Any] | None:
        job = admin(api, "GET", f"{collection}/{job_id}")
        return job if job["state"] in ("succeeded", "failed", "cancelled") else None

    return wait_until(finished, timeout_s, what=f"job {job_id} to end")
