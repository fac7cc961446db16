"""Enrollment is single-use and atomically claimed: a 60-way storm against one token
yields exactly one identity and one active credential, every time.

Real HTTP against a real API and PostgreSQL; the database is read directly only to verify.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

import httpx

from schemas.protocol import AUDIT
from tests.api_server import RunningApi
from tests.flows import (
    ENROLL,
    HEARTBEAT,
    NODES,
    create_token,
    enroll,
    enroll_body,
    heartbeat_body,
    released_together,
)
from tests.services import db_fetch

STORM = 60
ROUNDS = 5


async def open_connections(client: httpx.AsyncClient, count: int) -> None:
    """Open `count` keep-alive connections up front, so the storm is not paced by TCP setup."""
    responses = await asyncio.gather(*(client.get("/healthz") for _ in range(count)))
    assert all(r.status_code == 200 for r in responses)


def codes(responses: list[httpx.Response]) -> Counter[tuple[int, str | None]]:
    return Counter(
        (r.status_code, None if r.status_code < 400 else r.json()["code"]) for r in responses
    )


async def test_sixty_way_enrollment_storm_yields_one_identity_every_time(
    api: RunningApi, database_url: str
) -> None:
    with api.client() as admin:
        async with api.async_client() as client:
            await open_connections(client, STORM)
            for round_no in range(1, ROUNDS + 1):
                token = create_token(admin, api)
                hostnames = [f"storm-{round_no}-{i}" for i in range(STORM)]
                responses = await released_together(
                    STORM,
                    lambda i, token=token, hostnames=hostnames: client.post(
                        ENROLL, json=enroll_body(token, hostnames[i])
                    ),
                )

                assert codes(responses) == Counter(
                    {(201, None): 1, (401, "enrollment_token_used"): STORM - 1}
                ), f"round {round_no}: {codes(responses)}"
                winner_index = next(i for i, r in enumerate(responses) if r.status_code == 201)
                won = responses[winner_index].json()
                node_id = won["node_id"]

                # The admin API: exactly one new node, with the winner's hostname and
                # an active credential; the token is spent on it.
                listed = admin.get(NODES, headers=api.admin_headers, params={"limit": 1000})
                assert listed.status_code == 200
                assert len(listed.json()["items"]) == round_no
                detail = admin.get(f"{NODES}/{node_id}", headers=api.admin_headers)
                assert detail.status_code == 200
                assert detail.json()["has_active_credential"] is True
                assert detail.json()["hostname"] == hostnames[winner_index]

                # The audit log: exactly one node.enrolled for this node, one per round overall.
                audit = admin.get(
                    AUDIT, headers=api.admin_headers, params={"action": "node.enrolled"}
                )
                assert audit.status_code == 200
                enrolled = audit.json()["items"]
                assert len(enrolled) == round_no
                assert [row["target_id"] for row in enrolled].count(node_id) == 1

                # The database itself: one node row and one unrevoked credential for it,
                # and that credential is the one the winner was given.
                nodes = await db_fetch(
                    database_url,
                    "SELECT id FROM nodes WHERE hostname = ANY($1::text[])",
                    hostnames,
                )
                assert [str(row["id"]) for row in nodes] == [node_id]
                credentials = await db_fetch(
                    database_url,
                    "SELECT id, revoked_at FROM node_credentials WHERE node_id = $1",
                    uuid.UUID(node_id),
                )
                assert [(str(row["id"]), row["revoked_at"]) for row in credentials] == [
                    (won["credential_id"], None)
                ]
                tokens = await db_fetch(
                    database_url,
                    "SELECT used_by_node_id FROM enrollment_tokens WHERE used_by_node_id = $1",
                    uuid.UUID(node_id),
                )
                assert len(tokens) == 1

                # And the credential works.
                beat = admin.post(
                    HEARTBEAT,
                    json=heartbeat_body(node_id),
                    headers={"Authorization": f"Bearer {won['credential']}"},
                )
                assert beat.status_code == 200, beat.text

            total = await db_fetch(database_url, "SELECT count(*) AS n FROM nodes")
            assert total[0]["n"] == ROUNDS
            active = await db_fetch(
                database_url,
                "SELECT node_id, count(*) AS n FROM node_credentials "
                "WHERE revoked_at IS NULL GROUP BY node_id",
            )
            assert len(active) == ROUNDS
            assert all(row["n"] == 1 for row in active)


async def test_recovery_token_storm_rebinds_once(api: RunningApi, database_url: str) -> None:
    """A recovery token re-binds an existing identity: the storm still claims it once,
    revokes the old credential once, and leaves one active credential."""
    with api.client() as admin:
        node = enroll(admin, api, hostname="recover-me")
        async with api.async_client() as client:
            await open_connections(client, STORM)
            token = create_token(admin, api, node_id=node.node_id)
            responses = await released_together(
                STORM,
                lambda i: client.post(
                    ENROLL, json=enroll_body(token, f"recovered-{i}", node_id=node.node_id)
                ),
            )
        assert codes(responses) == Counter(
            {(201, None): 1, (401, "enrollment_token_used"): STORM - 1}
        ), codes(responses)
        won = next(r.json() for r in responses if r.status_code == 201)
        assert won["node_id"] == node.node_id

        old = admin.post(HEARTBEAT, json=heartbeat_body(node.node_id), headers=node.headers)
        assert old.status_code == 401
        assert old.json()["code"] == "credential_revoked"
        new = admin.post(
            HEARTBEAT,
            json=heartbeat_body(node.node_id),
            headers={"Authorization": f"Bearer {won['credential']}"},
        )
        assert new.status_code == 200, new.text

        nodes = await db_fetch(database_url, "SELECT id FROM nodes")
        assert [str(row["id"]) for row in nodes] == [node.node_id]
        credentials = await db_fetch(
            database_url,
            "SELECT id, revoked_at IS NULL AS active, revoked_reason FROM node_credentials "
            "WHERE node_id = $1 ORDER BY created_at",
            uuid.UUID(node.node_id),
        )
        assert [(str(r["id"]), r["active"]) for r in credentials if r["active"]] == [
            (won["credential_id"], True)
        ]
        assert [r["revoked_reason"] for r in credentials if not r["active"]] == ["re-enrolled"]

        audit = admin.get(AUDIT, headers=api.admin_headers, params={"action": "node.enrolled"})
        rebinds = [row for row in audit.json()["items"] if row["details"]["rebound"]]
        assert len(rebinds) == 1
        assert rebinds[0]["target_id"] == node.node_id
