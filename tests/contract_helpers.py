"""Shared fixture and assertions of the error-contract tests."""

from __future__ import annotations

import re
import secrets
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from api.settings import ApiSettings
from schemas.protocol import AUDIT
from tests.api_server import OPERATOR_KEY, PRESENCE_GAP_S, RunningApi, free_port, start_api
from tests.flows import (
    NODES,
)
from tests.pipeline import RunningPipeline
from tests.services import admin_execute, drop_database, with_database

GENERATED_CORRELATION_ID = re.compile(r"^[0-9a-f]{32}$")


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def shared_api(
    pg_admin_url: str,
    migrated_template: str,
    nats_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RunningApi]:
    """One server and database for the many small cases of this module.

    Each case enrolls its own nodes and looks only at them, so sharing is safe; it saves
    a database copy and a server start per case. Tests that count global state use `api`.
    """
    name = f"mf_contract_{secrets.token_hex(6)}"
    admin_execute(pg_admin_url, f'CREATE DATABASE "{name}" TEMPLATE "{migrated_template}"')
    database_url = with_database(pg_admin_url, name)
    pipeline = RunningPipeline(database_url, tmp_path_factory.mktemp("pipeline")).start()
    try:
        running = start_api(
            ApiSettings(
                database_url=database_url,
                nats_url=nats_url,
                operator_api_key=OPERATOR_KEY,
                port=free_port(),
                db_pool_size=20,
                presence_gap_s=PRESENCE_GAP_S,
                artifact_source_url="http://127.0.0.1:9",
            )
        )
        running.pipeline = pipeline
        try:
            yield running
        finally:
            running.stop()
    finally:
        pipeline.stop()
        drop_database(pg_admin_url, name)


# --------------------------------------------------------------------------- helpers


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    """The shared shape of every refusal: status, typed body, correlation id in both places."""
    assert response.status_code == status, response.text
    correlation_id = response.headers.get("X-Correlation-ID")
    assert correlation_id, f"no X-Correlation-ID on {response.status_code}"
    assert response.headers["content-type"].startswith("application/json")
    body: dict[str, Any] = response.json()
    assert body["correlation_id"] == correlation_id
    assert isinstance(body["message"], str) and body["message"]
    if code is not None:
        assert body["code"] == code, body
    return body


def assert_ok(response: httpx.Response, status: int = 200) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers.get("X-Correlation-ID")
    body: dict[str, Any] = response.json()
    return body


def bearer(value: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {value}"}


def unknown_credential() -> str:
    return f"mfn.{uuid.uuid4().hex}.{secrets.token_urlsafe(32)}"


def node_view(client: httpx.Client, api: RunningApi, node_id: str) -> dict[str, Any]:
    api.settle()  # GPUs are reconciled by the workers
    return assert_ok(client.get(f"{NODES}/{node_id}", headers=api.admin_headers))


def audit_rows(client: httpx.Client, api: RunningApi, **params: Any) -> list[dict[str, Any]]:
    api.settle()
    response = client.get(AUDIT, params={"limit": 1000, **params}, headers=api.admin_headers)
    items: list[dict[str, Any]] = assert_ok(response)["items"]
    return items
