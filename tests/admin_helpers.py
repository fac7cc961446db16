"""Shared steps of the admin API tests (tests/test_admin_*.py), and the operators' event
stream held open as a test reads it (watching)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from sqlalchemy import NullPool, text
from sqlalchemy.ext.asyncio import create_async_engine

from schemas.events import CloudEvent
from schemas.protocol import ADMIN_EVENTS, AUDIT
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


# --------------------------------------------------------------------------- event stream

# An event is published by the relay within its poll interval (0.5 s in tests) of the
# commit; this bounds the whole trip with room for a loaded machine.
ARRIVAL_S = 15.0


@dataclass
class Stream:
    events: asyncio.Queue[tuple[str, str, dict[str, Any]]] = field(default_factory=asyncio.Queue)
    opened: asyncio.Event = field(default_factory=asyncio.Event)
    # Set only when the API ends the stream, not when the connection breaks.
    closed: asyncio.Event = field(default_factory=asyncio.Event)

    async def next(self, timeout_s: float = ARRIVAL_S) -> tuple[str, str, dict[str, Any]]:
        return await asyncio.wait_for(self.events.get(), timeout_s)

    async def until(self, action: str) -> CloudEvent:
        """The next event with this action, skipping the others."""
        while True:
            _, _, data = await self.next()
            if data.get("action") == action:
                return CloudEvent.model_validate(data)


@contextlib.asynccontextmanager
async def watching(
    api: RunningApi,
    resume_after: str | None = None,
    *,
    cookies: dict[str, str] | None = None,
    **params: str,
) -> AsyncIterator[Stream]:
    """An open admin event stream; entered once the API says it is subscribed.
    resume_after: the Last-Event-ID it reconnects with; cookies: a dashboard session's,
    sent instead of the operator key."""
    headers = dict(api.admin_headers) if cookies is None else {}
    if resume_after is not None:
        headers["Last-Event-ID"] = resume_after
    held = Stream()

    async def hold() -> None:
        timeout = httpx.Timeout(10.0, read=60.0)
        async with (
            httpx.AsyncClient(base_url=api.base_url, timeout=timeout, cookies=cookies) as client,
            client.stream("GET", ADMIN_EVENTS, params=params, headers=headers) as got,
        ):
            assert got.status_code == 200
            assert got.headers["content-type"].startswith("text/event-stream")
            fields: dict[str, str] = {}
            async for line in got.aiter_lines():
                if line == ": connected":
                    held.opened.set()
                elif line == "":
                    if "event" in fields:
                        data = json.loads(fields.get("data", "{}"))
                        await held.events.put((fields.get("id", ""), fields["event"], data))
                    fields = {}
                elif not line.startswith(":"):
                    name, _, value = line.partition(": ")
                    fields[name] = value
        held.closed.set()

    task = asyncio.create_task(hold())
    opened = asyncio.create_task(held.opened.wait())
    await asyncio.wait({task, opened}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()  # the reader's failure, as it is
    assert held.opened.is_set(), "the event stream did not open"
    try:
        yield held
    finally:
        opened.cancel()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
