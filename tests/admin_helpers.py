"""Shared steps of the admin API tests (tests/test_admin_*.py)."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
from sqlalchemy import NullPool, text
from sqlalchemy.ext.asyncio import create_async_engine

from schemas.protocol import AUDIT
from tests.api_server import RunningApi
from tests.flows import (
    ENROLL,
    HEARTBEAT,
    NODES,
    TOKENS,
    EnrolledNode,
    enroll_body,
    heartbeat_body,
)
from tests.services import run_async

# --------------------------------------------------------------------------- helpers


def ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, f"{response.status_code}: {response.text}"
    assert response.headers.get("X-Correlation-ID")
    return response.json()


def refused(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, f"{response.status_code}: {response.text}"
    body: dict[str, Any] = response.json()
    assert body["code"] == code, body
    assert body["correlation_id"] == response.headers["X-Correlation-ID"]
    return body


def credential_id(credential: str) -> str:
    return str(uuid.UUID(hex=credential.split(".")[1]))


def token_id(secret: str) -> str:
    return str(uuid.UUID(hex=secret.split(".")[1]))


def new_token(client: httpx.Client, api: RunningApi, **body: Any) -> dict[str, Any]:
    created: dict[str, Any] = ok(client.post(TOKENS, json=body, headers=api.admin_headers), 201)
    return created


def enroll_with(
    client: httpx.Client, token: str, hostname: str = "gpu-host-1", **extra: Any
) -> EnrolledNode:
    data = ok(client.post(ENROLL, json=enroll_body(token, hostname, **extra)), 201)
    return EnrolledNode(node_id=data["node_id"], credential=data["credential"])


def get_node(client: httpx.Client, api: RunningApi, node_id: str) -> dict[str, Any]:
    node: dict[str, Any] = ok(client.get(f"{NODES}/{node_id}", headers=api.admin_headers))
    return node


def patch_node(client: httpx.Client, api: RunningApi, node_id: str, **body: Any) -> httpx.Response:
    return client.patch(f"{NODES}/{node_id}", json=body, headers=api.admin_headers)


def list_nodes(client: httpx.Client, api: RunningApi, params: Any = None) -> list[str]:
    items = ok(client.get(NODES, params=params, headers=api.admin_headers))["items"]
    return sorted(item["id"] for item in items)


def beat(client: httpx.Client, node: EnrolledNode, **extra: Any) -> httpx.Response:
    return client.post(HEARTBEAT, json=heartbeat_body(node.node_id, **extra), headers=node.headers)


def audit(client: httpx.Client, api: RunningApi, **params: Any) -> list[dict[str, Any]]:
    api.settle()
    items: list[dict[str, Any]] = ok(
        client.get(AUDIT, params={"limit": 1000, **params}, headers=api.admin_headers)
    )["items"]
    return items


def decommission_body(
    client: httpx.Client, headers: dict[str, str], node_id: str, reason: str = "hardware retired"
) -> dict[str, str]:
    """The execute body for what the node's preview says now (its plan hash)."""
    preview = ok(client.get(f"{NODES}/{node_id}/decommission/preview", headers=headers))
    return {"confirm_node_id": node_id, "plan_hash": preview["plan_hash"], "reason": reason}


def decommission(
    client: httpx.Client,
    api: RunningApi,
    node_id: str,
    confirm: str | None = None,
    plan_hash: str | None = None,
) -> httpx.Response:
    """Preview, then execute with the preview's hash (or the one given)."""
    body = decommission_body(client, api.admin_headers, node_id)
    body["confirm_node_id"] = confirm or node_id
    if plan_hash is not None:
        body["plan_hash"] = plan_hash
    return client.post(f"{NODES}/{node_id}/decommission", json=body, headers=api.admin_headers)


def db_scalar(database_url: str, sql: str, **params: Any) -> Any:
    """Read the database directly (outbox rows have no HTTP view)."""

    async def query() -> Any:
        engine = create_async_engine(database_url, poolclass=NullPool)
        try:
            async with engine.connect() as conn:
                return (await conn.execute(text(sql), params)).scalar_one()
        finally:
            await engine.dispose()

    return run_async(query)


def outbox_count(database_url: str) -> int:
    count: int = db_scalar(database_url, "SELECT count(*) FROM outbox")
    return count


def audit_count(client: httpx.Client, api: RunningApi) -> int:
    return len(audit(client, api))
