"""Deployment steps shared by tests, over real HTTP: a node (the test speaking for its
agent and runtime worker) with a deployment made ready through the protocol, service
clients, the runtime worker's side of an invoke (its channel, its answer stream), and
bounded waits for a deployment's state (as the API shows it, or after the workers'
liveness sweep and reconciler ran)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from schemas.deployments import ENDED_STATES
from schemas.protocol import (
    AUDIT,
    DEPLOYMENT_JOB_COMPLETE,
    DEPLOYMENT_JOB_FAIL,
    DEPLOYMENT_JOBS_NEXT,
    DEPLOYMENTS,
    HEARTBEAT,
    INVOKE_EPOCH_HEADER,
    INVOKE_GATEWAY_HEADER,
    INVOKE_LEASE_HEADER,
    INVOKE_STATUS_HEADER,
    INVOKE_STREAM,
    RUNTIME_CHANNEL,
    SERVICE_CLIENTS,
)
from store.deployments.rules import ReconcilePolicy
from store.liveness import LivenessThresholds
from store.liveness_sweep import sweep
from tests.admin_helpers import ok
from tests.agent.harness import wait_until
from tests.api_server import RunningApi
from tests.artifact_flows import COMMIT, REPOSITORY
from tests.flows import NO_BREAKER, THRESHOLDS, EnrolledNode, heartbeat_body
from tests.runtime_flows import (
    GGUF,
    create_profile,
    environment_id,
    ready_node,
    report_runtime,
)
from workers.deployments import reconcile

HEALTHY = {"process_up": True, "health_ok": True, "model_listed": True, "inference_ok": True}
# The reconciler as the tests run it: no periodic health checks of their own.
RECONCILE_POLICY = ReconcilePolicy(health_period_s=3600)


def deployment_body(
    node: EnrolledNode, profile_id: str, environment: str, **extra: Any
) -> dict[str, Any]:
    return {
        "node_id": node.node_id,
        "device_id": "cpu",
        "artifact": {"repository": REPOSITORY, "commit": COMMIT, "path": GGUF},
        "profile_id": profile_id,
        "environment_id": environment,
        "model": "smol",
        "roles": ["planner"],
        **extra,
    }


def create_deployment(
    client: httpx.Client, api: RunningApi, body: dict[str, Any]
) -> dict[str, Any]:
    created: dict[str, Any] = ok(
        client.post(DEPLOYMENTS, json=body, headers=api.admin_headers), 201
    )
    return created


def deployment(client: httpx.Client, api: RunningApi, deployment_id: str) -> dict[str, Any]:
    view: dict[str, Any] = ok(
        client.get(f"{DEPLOYMENTS}/{deployment_id}", headers=api.admin_headers)
    )
    return view


def wait_for_deployment(
    api: RunningApi, deployment_id: str, state: str, timeout_s: float
) -> dict[str, Any]:
    """The deployment's view once the API shows it in `state`, polled until a deadline;
    one that ended in another state (failed, unloaded) fails the wait at once."""

    def reached() -> dict[str, Any] | None:
        with api.client() as client:
            view = deployment(client, api, deployment_id)
        assert view["state"] == state or view["state"] not in ENDED_STATES, view
        return view if view["state"] == state else None

    return wait_until(reached, timeout_s, f"the deployment {state}")


async def state_after_sweeps(
    sessions: async_sessionmaker[AsyncSession],
    api: RunningApi,
    deployment_id: str,
    thresholds: LivenessThresholds = THRESHOLDS,
) -> str:
    """One pass of the liveness sweep (no partition breaker) and the deployment reconciler,
    as the workers run them, then the deployment's state."""
    await sweep(sessions, thresholds, breaker=NO_BREAKER)
    await reconcile(sessions, RECONCILE_POLICY)

    def read() -> str:
        with api.client() as client:
            return str(deployment(client, api, deployment_id)["state"])

    return await asyncio.to_thread(read)


async def until_state(
    check: Callable[[], Awaitable[str]], state: str, timeout_s: float = 20
) -> None:
    """Run `check` (e.g. a `state_after_sweeps`) until it answers `state`, or fail at the
    deadline with the last state seen."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = await check()
        if last == state:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"the deployment stayed {last}, not {state}")


def claim_deployment_job(client: httpx.Client, node: EnrolledNode) -> dict[str, Any]:
    claim: dict[str, Any] = ok(client.get(DEPLOYMENT_JOBS_NEXT, headers=node.headers))
    return claim


def lease_of(claim: dict[str, Any]) -> dict[str, Any]:
    return {"lease_id": claim["lease"]["lease_id"], "epoch": claim["lease"]["epoch"]}


def complete_load(
    client: httpx.Client, node: EnrolledNode, claim: dict[str, Any]
) -> httpx.Response:
    body = {"kind": "deployment.load.v1", "lease": lease_of(claim), "device_id": "cpu",
            "health": HEALTHY, "load_s": 0.3}  # fmt: skip
    return client.post(DEPLOYMENT_JOB_COMPLETE.format(job_id=claim["job_id"]), json=body,
                       headers=node.headers)  # fmt: skip


def complete_target(
    client: httpx.Client, node: EnrolledNode, claim: dict[str, Any], **fields: Any
) -> httpx.Response:
    body = {"kind": claim["kind"], "lease": lease_of(claim), **fields}
    path = DEPLOYMENT_JOB_COMPLETE.format(job_id=claim["job_id"])
    return client.post(path, json=body, headers=node.headers)


def fail_deployment_job(
    client: httpx.Client, node: EnrolledNode, claim: dict[str, Any], code: str, *, retryable: bool
) -> httpx.Response:
    body = {"lease": lease_of(claim), "code": code, "retryable": retryable, "detail": "test"}
    return client.post(DEPLOYMENT_JOB_FAIL.format(job_id=claim["job_id"]), json=body,
                       headers=node.headers)  # fmt: skip


def beat(client: httpx.Client, node: EnrolledNode) -> None:
    response = client.post(HEARTBEAT, json=heartbeat_body(node.node_id), headers=node.headers)
    assert response.status_code == 200, response.text


@dataclass
class DeployedNode:
    node: EnrolledNode
    deployment: dict[str, Any]
    sequence: int = 1

    def report(self, client: httpx.Client, *, loaded: bool, in_flight: int = 0) -> None:
        """The runtime worker's report, listing the deployment as loaded or not."""
        self.sequence += 1
        entry = {"deployment_id": self.deployment["id"], "device_id": "cpu", "model": "smol",
                 "state": "ready", "in_flight": in_flight}  # fmt: skip
        listed = [entry] if loaded else []
        response = report_runtime(client, self.node, self.sequence, deployments=listed)
        assert response.status_code == 200 and response.json()["applied"], response.text


def ready_deployment(
    client: httpx.Client, api: RunningApi, hostname: str = "gpu-host-1", **extra: Any
) -> DeployedNode:
    """A node with a deployment loaded and ready, the test acting as its runtime worker."""
    node = ready_node(client, api, hostname=hostname)
    beat(client, node)
    profile = create_profile(client, api, name=f"p-{hostname}")
    created = create_deployment(
        client, api, deployment_body(node, profile["id"], environment_id(client, api), **extra)
    )
    assert created["state"] == "pending"
    claim = claim_deployment_job(client, node)
    assert claim["kind"] == "deployment.load.v1"
    assert complete_load(client, node, claim).status_code == 200
    deployed = DeployedNode(node, deployment(client, api, created["id"]))
    assert deployed.deployment["state"] == "ready"
    deployed.report(client, loaded=True)
    return deployed


def created_service_client(client: httpx.Client, api: RunningApi, **body: Any) -> dict[str, Any]:
    """A new service client as the API answered its creation (its id, its secret), scoped
    to the model `smol` and role `planner` unless the body says otherwise."""
    payload = {"name": "app", "models": ["smol"], "roles": ["planner"], **body}
    created: dict[str, Any] = ok(
        client.post(SERVICE_CLIENTS, json=payload, headers=api.admin_headers), 201
    )
    return created


def service_client(client: httpx.Client, api: RunningApi, **body: Any) -> str:
    """A new service client's secret (created_service_client)."""
    secret: str = created_service_client(client, api, **body)["secret"]
    return secret


def live_and_revoked(client: httpx.Client, api: RunningApi, name: str) -> tuple[str, str]:
    """The secrets of a live service client (`name`-live) and of a revoked one
    (`name`-revoked)."""
    live = service_client(client, api, name=f"{name}-live")
    revoked = created_service_client(client, api, name=f"{name}-revoked")
    ok(client.post(f"{SERVICE_CLIENTS}/{revoked['id']}/revoke", headers=api.admin_headers))
    return live, revoked["secret"]


def transitions(api: RunningApi, deployment_id: str) -> list[tuple[str, str]]:
    """The deployment's state changes, oldest first, as the audit log has them."""
    api.settle()
    with api.client() as client:
        rows = client.get(
            AUDIT,
            params={"action": "deployment.state_changed", "target_id": deployment_id},
            headers=api.admin_headers,
        ).json()["items"]
    return [(r["details"]["previous"], r["details"]["state"]) for r in reversed(rows)]


@dataclass
class HeldChannel:
    """A runtime channel held by the test for a node: the invokes it delivered."""

    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    opened: threading.Event = field(default_factory=threading.Event)
    arrived: threading.Condition = field(default_factory=threading.Condition)

    def next_invoke(self, timeout_s: float = 20) -> dict[str, Any]:
        with self.arrived:
            found = self.arrived.wait_for(
                lambda: any(kind == "invoke" for kind, _ in self.events), timeout_s
            )
            assert found, "no invoke came down the runtime channel"
            index = next(i for i, (kind, _) in enumerate(self.events) if kind == "invoke")
            return self.events.pop(index)[1]

    def wait_for(self, kind: str, timeout_s: float = 20) -> dict[str, Any]:
        with self.arrived:
            found = self.arrived.wait_for(lambda: any(k == kind for k, _ in self.events), timeout_s)
            assert found, f"no {kind} came down the runtime channel"
            index = next(i for i, (k, _) in enumerate(self.events) if k == kind)
            return self.events.pop(index)[1]


@contextlib.contextmanager
def runtime_channel(api: RunningApi, node: EnrolledNode) -> Iterator[HeldChannel]:
    """Hold the node's runtime channel in a thread until the block ends."""
    held = HeldChannel()
    stop = threading.Event()

    def hold() -> None:
        timeout = httpx.Timeout(5, read=None)
        with (
            httpx.Client(base_url=api.base_url, timeout=timeout) as client,
            client.stream("GET", RUNTIME_CHANNEL, headers=node.headers) as response,
        ):
            event = None
            for line in response.iter_lines():
                held.opened.set()
                if stop.is_set():
                    return
                if line.startswith("event:"):
                    event = line.removeprefix("event:").strip()
                elif line.startswith("data:") and event:
                    with held.arrived:
                        held.events.append((event, json.loads(line.removeprefix("data:"))))
                        held.arrived.notify_all()
                    event = None

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert held.opened.wait(10), "the runtime channel did not open"
    try:
        yield held
    finally:
        stop.set()


def answer_invoke(
    api: RunningApi,
    node: EnrolledNode,
    invoke: dict[str, Any],
    body: bytes | Iterable[bytes],
    *,
    status: int = 200,
    content_type: str = "application/json",
    epoch: int | None = None,
    lease_id: str | None = None,
) -> httpx.Response:
    """The runtime worker's answer stream for an invoke (chunks sent as they are)."""
    chunks = [body] if isinstance(body, bytes) else body
    headers = {
        **node.headers,
        INVOKE_LEASE_HEADER: lease_id or invoke["lease"]["lease_id"],
        INVOKE_EPOCH_HEADER: str(epoch if epoch is not None else invoke["lease"]["epoch"]),
        INVOKE_GATEWAY_HEADER: invoke["gateway"],
        INVOKE_STATUS_HEADER: str(status),
        "Content-Type": content_type,
    }
    with api.client() as client:
        return client.post(
            INVOKE_STREAM.format(invoke_id=invoke["invoke_id"]),
            content=iter(chunks),
            headers=headers,
        )


def completion(text: str = "ready") -> bytes:
    return json.dumps({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "smol",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }).encode()  # fmt: skip
