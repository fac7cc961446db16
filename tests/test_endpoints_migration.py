"""Migration 0020: the deployments and services that exist before it serve the default
endpoints (chat and completions, what they served) and report no capabilities; a
downgrade takes the columns away again."""

from __future__ import annotations

import json
import uuid

from store.migrate import downgrade, upgrade
from tests.services import db_fetch, run_async, run_sync

TEMPLATE = {"profile_id": str(uuid.uuid4()), "max_concurrent": 4}


def _insert_service(database_url: str) -> uuid.UUID:
    """A service as 0019 stores it (no FK to anything: the rest is JSON)."""
    service_id = uuid.uuid4()

    async def insert() -> None:
        await db_fetch(
            database_url,
            "INSERT INTO services (id, name, roles, state, template, generation, replicas,"
            " placement, strategy, rollout_state, created_at, updated_at)"
            " VALUES ($1, 'old-svc', '[]', 'active', $2::jsonb, 1, 1, '{}', '{}', 'complete',"
            " now(), now())",
            service_id,
            json.dumps(TEMPLATE),
        )

    run_async(insert)
    return service_id


def _columns(database_url: str, table: str) -> set[str]:
    rows = run_async(
        lambda: db_fetch(
            database_url,
            "SELECT column_name FROM information_schema.columns WHERE table_name = $1",
            table,
        )
    )
    return {row["column_name"] for row in rows}


def test_existing_rows_serve_the_default_endpoints(database_url: str) -> None:
    run_sync(lambda: downgrade(database_url, "0019"))
    assert "endpoints" not in _columns(database_url, "services")
    service_id = _insert_service(database_url)

    run_sync(lambda: upgrade(database_url))
    rows = run_async(
        lambda: db_fetch(database_url, "SELECT endpoints FROM services WHERE id = $1", service_id)
    )
    assert json.loads(rows[0]["endpoints"]) == ["chat", "completions"]
    assert {"endpoints", "capabilities"} <= _columns(database_url, "deployments")
    nullable = run_async(
        lambda: db_fetch(
            database_url,
            "SELECT table_name, column_name, is_nullable FROM information_schema.columns"
            " WHERE column_name IN ('endpoints', 'capabilities')"
            " AND table_name IN ('deployments', 'services')",
        )
    )
    assert {(r["table_name"], r["column_name"], r["is_nullable"]) for r in nullable} == {
        ("deployments", "endpoints", "NO"),
        ("services", "endpoints", "NO"),
        ("deployments", "capabilities", "YES"),
    }

    run_sync(lambda: downgrade(database_url, "0019"))
    assert "endpoints" not in _columns(database_url, "deployments")
    assert "capabilities" not in _columns(database_url, "deployments")
    run_sync(lambda: upgrade(database_url))
