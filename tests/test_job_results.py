"""A job's result has a column of its own (migration 0009): results written before it,
in progress["result"], move there on upgrade and back on downgrade, and what else
progress held stays."""

from __future__ import annotations

import json
import uuid

from store.migrate import downgrade, upgrade
from tests.services import db_fetch, run_async, run_sync

HEALTH = {
    "device_id": "cpu",
    "health": {"process_up": True, "health_ok": True, "model_listed": True, "inference_ok": True},
    "loaded_model": "smol",
}
ARTIFACT_PROGRESS = {"bytes_done": 10, "bytes_total": 10, "files_done": 1, "files_total": 1}


def _insert(database_url: str) -> tuple[uuid.UUID, uuid.UUID, uuid.UUID]:
    """A node with a health job that holds its result in progress (as 0008 wrote it), an
    unload job whose progress had a phase besides its result, and an artifact job."""
    node, health, unload, artifact = (uuid.uuid4() for _ in range(4))
    jobs = [
        (health, "runtime.health.v1", {"result": HEALTH}),
        (unload, "runtime.unload.v1", {"phase": "probing", "result": {"device_id": "cpu"}}),
        (artifact, "artifact.acquire.v1", ARTIFACT_PROGRESS),
    ]

    async def insert() -> None:
        await db_fetch(
            database_url,
            "INSERT INTO nodes (id, hostname, protocol_version, agent_version)"
            " VALUES ($1, 'old-host', 1, '0.1')",
            node,
        )
        for job_id, kind, progress in jobs:
            await db_fetch(
                database_url,
                "INSERT INTO jobs (id, kind, node_id, state, spec, max_attempts, available_at,"
                " progress, created_at, updated_at)"
                " VALUES ($1, $2, $3, 'succeeded', '{}', 3, now(), $4::jsonb, now(), now())",
                job_id,
                kind,
                node,
                json.dumps(progress),
            )

    run_async(insert)
    return health, unload, artifact


def _json(value: str | None) -> object:
    return None if value is None else json.loads(value)


def _rows(database_url: str, with_result: bool) -> dict[uuid.UUID, tuple[object, object]]:
    columns = "id, progress, result" if with_result else "id, progress, NULL AS result"
    rows = run_async(lambda: db_fetch(database_url, f"SELECT {columns} FROM jobs"))  # noqa: S608
    return {row["id"]: (_json(row["progress"]), _json(row["result"])) for row in rows}


def test_results_move_out_of_progress_and_back(database_url: str) -> None:
    run_sync(lambda: downgrade(database_url, "0008"))
    health, unload, artifact = _insert(database_url)

    run_sync(lambda: upgrade(database_url))
    after = _rows(database_url, with_result=True)
    assert after[health] == (None, HEALTH)
    assert after[unload] == ({"phase": "probing"}, {"device_id": "cpu"})
    assert after[artifact] == (ARTIFACT_PROGRESS, None)

    run_sync(lambda: downgrade(database_url, "0008"))
    before = _rows(database_url, with_result=False)
    assert before[health] == ({"result": HEALTH}, None)
    assert before[unload] == ({"phase": "probing", "result": {"device_id": "cpu"}}, None)
    assert before[artifact] == (ARTIFACT_PROGRESS, None)
