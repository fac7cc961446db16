"""Concurrent credential rotation, rotation against revocation, and same-sequence samples.

Each race must be serially consistent: the outcome is one that some serial order of the
same requests would have produced, and at most one credential of a node is ever active.
And the process that rotated, revoked, disabled or decommissioned refuses the node's
next request at once, from its node cache too, without its own NOTIFY.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Any

import httpx
import pytest

from schemas.protocol import AUDIT
from tests.agent.harness import wait_until
from tests.api_processes import REFUSALS, answered_from_cache, refuse
from tests.api_server import RunningApi
from tests.flows import (
    HEARTBEAT,
    INVENTORY,
    NODES,
    TELEMETRY,
    EnrolledNode,
    enroll,
    gpu,
    heartbeat_body,
    inventory_body,
    now,
    released_together,
    telemetry_body,
)
from tests.services import db_fetch

ROTATIONS = 20
ROUNDS = 4


async def active_credentials(database_url: str, node_id: str) -> list[str]:
    rows = await db_fetch(
        database_url,
        "SELECT id FROM node_credentials WHERE node_id = $1 AND revoked_at IS NULL",
        uuid.UUID(node_id),
    )
    return [str(row["id"]) for row in rows]


async def warm(client: httpx.AsyncClient, count: int) -> None:
    responses = await asyncio.gather(*(client.get("/healthz") for _ in range(count)))
    assert all(r.status_code == 200 for r in responses)


def bearer(credential: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential}"}


def error_code(response: httpx.Response) -> str:
    code: str = response.json()["code"]
    return code


async def test_concurrent_rotations_leave_exactly_one_working_credential(
    api: RunningApi, database_url: str
) -> None:
    with api.client() as admin:
        node = enroll(admin, api)
        rotate = f"{NODES}/{node.node_id}/credential/rotate"
        current_id = (await active_credentials(database_url, node.node_id))[0]
        current_wire = node.credential
        async with api.async_client() as client:
            await warm(client, ROTATIONS)
            for round_no in range(1, ROUNDS + 1):
                responses = await released_together(
                    ROTATIONS, lambda _: client.post(rotate, headers=api.admin_headers)
                )
                assert [r.status_code for r in responses] == [200] * ROTATIONS, [
                    r.text for r in responses if r.status_code != 200
                ]
                results = [r.json() for r in responses]
                issued = {r["credential_id"]: r for r in results}
                assert len(issued) == ROTATIONS

                # Serial consistency: each rotation revoked exactly the credential active
                # just before it, so the revocations chain from the round's starting
                # credential through every new one but the last.
                successor = {}
                for result in results:
                    assert len(result["revoked_credential_ids"]) == 1, result
                    (revoked,) = result["revoked_credential_ids"]
                    assert revoked not in successor, "a credential was revoked twice"
                    successor[revoked] = result["credential_id"]
                chain = [current_id]
                while chain[-1] in successor:
                    chain.append(successor[chain[-1]])
                assert len(chain) == ROTATIONS + 1, "rotations did not form one serial chain"
                last = chain[-1]

                assert await active_credentials(database_url, node.node_id) == [last]

                # Exactly one of the returned credentials (the last committed) works; every
                # other one, and the credential from before the round, is revoked.
                beats = await asyncio.gather(
                    *(
                        client.post(
                            HEARTBEAT,
                            json=heartbeat_body(node.node_id),
                            headers=bearer(result["credential"]),
                        )
                        for result in results
                    )
                )
                outcome = {
                    result["credential_id"]: (beat.status_code, beat.json().get("code"))
                    for result, beat in zip(results, beats, strict=True)
                }
                assert outcome.pop(last) == (200, None)
                assert set(outcome.values()) == {(401, "credential_revoked")}
                before = await client.post(
                    HEARTBEAT, json=heartbeat_body(node.node_id), headers=bearer(current_wire)
                )
                assert before.status_code == 401
                assert error_code(before) == "credential_revoked"

                detail = admin.get(f"{NODES}/{node.node_id}", headers=api.admin_headers)
                assert detail.json()["has_active_credential"] is True
                current_id, current_wire = last, issued[last]["credential"]

                audit = admin.get(
                    AUDIT,
                    headers=api.admin_headers,
                    params={"action": "node.credential.rotated", "limit": 1000},
                )
                assert len(audit.json()["items"]) == ROTATIONS * round_no

        rows = await db_fetch(
            database_url,
            "SELECT revoked_at IS NULL AS active, revoked_reason FROM node_credentials "
            "WHERE node_id = $1",
            uuid.UUID(node.node_id),
        )
        assert len(rows) == 1 + ROTATIONS * ROUNDS
        assert Counter((r["active"], r["revoked_reason"]) for r in rows) == Counter(
            {(True, None): 1, (False, "rotated"): ROTATIONS * ROUNDS}
        )


async def test_rotate_racing_revoke_is_serially_consistent(
    api: RunningApi, database_url: str
) -> None:
    with api.client() as admin:
        node = enroll(admin, api)
        base = f"{NODES}/{node.node_id}/credential"
        effective_revocations = 0
        async with api.async_client() as client:
            await warm(client, 4)
            for _ in range(8):
                before = await active_credentials(database_url, node.node_id)
                rotated, revoked = await released_together(
                    2,
                    lambda i: client.post(
                        f"{base}/rotate" if i == 0 else f"{base}/revoke",
                        headers=api.admin_headers,
                    ),
                )
                assert rotated.status_code == 200, rotated.text
                assert revoked.status_code == 200, revoked.text
                new_id = rotated.json()["credential_id"]
                rotation_revoked = rotated.json()["revoked_credential_ids"]
                revocation_revoked = revoked.json()["revoked_credential_ids"]
                after = await active_credentials(database_url, node.node_id)
                beat = await client.post(
                    HEARTBEAT,
                    json=heartbeat_body(node.node_id),
                    headers=bearer(rotated.json()["credential"]),
                )
                detail = admin.get(f"{NODES}/{node.node_id}", headers=api.admin_headers).json()
                if new_id in revocation_revoked:
                    # rotate, then revoke: the revocation took the fresh credential.
                    assert rotation_revoked == before
                    assert revocation_revoked == [new_id]
                    assert after == []
                    assert beat.status_code == 401
                    assert error_code(beat) == "credential_revoked"
                    assert detail["has_active_credential"] is False
                else:
                    # revoke, then rotate: the rotation found nothing active to revoke.
                    assert revocation_revoked == before
                    assert rotation_revoked == []
                    assert after == [new_id]
                    assert beat.status_code == 200, beat.text
                    assert detail["has_active_credential"] is True
                effective_revocations += bool(revocation_revoked)

        # Both operations are audited separately; a revocation that found nothing active
        # records nothing.
        audit = admin.get(AUDIT, headers=api.admin_headers, params={"limit": 1000}).json()
        actions = Counter(row["action"] for row in audit["items"])
        assert actions["node.credential.rotated"] == 8
        assert actions["node.credential.revoked"] == effective_revocations


async def test_mixed_rotate_and_revoke_storm_revokes_each_credential_once(
    api: RunningApi, database_url: str
) -> None:
    with api.client() as admin:
        node = enroll(admin, api)
        base = f"{NODES}/{node.node_id}/credential"
        original = await active_credentials(database_url, node.node_id)
        async with api.async_client() as client:
            await warm(client, 20)
            responses = await released_together(
                20,
                lambda i: client.post(
                    f"{base}/rotate" if i % 2 == 0 else f"{base}/revoke",
                    headers=api.admin_headers,
                ),
            )
        assert [r.status_code for r in responses] == [200] * 20
        issued = [r.json()["credential_id"] for r in responses[0::2]]
        revocations = [c for r in responses for c in r.json()["revoked_credential_ids"]]
        active = await active_credentials(database_url, node.node_id)
        assert len(active) <= 1
        # Every credential that ever existed is either the one active now or was revoked by
        # exactly one of these requests: none revoked twice, none lost.
        assert Counter(revocations + active) == Counter(original + issued)
        detail = admin.get(f"{NODES}/{node.node_id}", headers=api.admin_headers).json()
        assert detail["has_active_credential"] is bool(active)


def replay_counts(responses: list[httpx.Response]) -> Counter[tuple[int, Any]]:
    return Counter(
        (r.status_code, r.json()["applied"] if r.status_code == 200 else r.json()["code"])
        for r in responses
    )


async def test_same_sequence_storm_accepts_exactly_one(api: RunningApi) -> None:
    concurrency = 20
    with api.client() as admin:
        node = enroll(admin, api)
        async with api.async_client() as client:
            await warm(client, concurrency)
            for sequence in range(1, 4):
                observed = now()
                hostnames = [f"host-{sequence}-{i}" for i in range(concurrency)]
                inventories = await released_together(
                    concurrency,
                    lambda i, observed=observed, hostnames=hostnames, sequence=sequence: client.put(
                        INVENTORY,
                        json=inventory_body(
                            node.node_id,
                            sequence,
                            observed_at=observed,
                            hostname=hostnames[i],
                            gpus=[gpu(0, f"GPU-seq-{sequence}")],
                        ),
                        headers=node.headers,
                    ),
                )
                assert replay_counts(inventories) == Counter(
                    {(200, True): 1, (409, "sequence_replayed"): concurrency - 1}
                ), replay_counts(inventories)
                for response in inventories:
                    if response.status_code == 409:
                        extra = response.json()["extra"]
                        assert extra == {"stream": "inventory", "cursor": sequence}
                winner = next(i for i, r in enumerate(inventories) if r.status_code == 200)

                telemetries = await released_together(
                    concurrency,
                    lambda i, observed=observed, sequence=sequence: client.put(
                        TELEMETRY,
                        json=telemetry_body(node.node_id, sequence, observed_at=observed)
                        | {"ram_used_bytes": 1000 + i},
                        headers=node.headers,
                    ),
                )
                assert replay_counts(telemetries) == Counter(
                    {(200, True): 1, (409, "sequence_replayed"): concurrency - 1}
                ), replay_counts(telemetries)
                telemetry_winner = next(
                    i for i, r in enumerate(telemetries) if r.status_code == 200
                )

                heartbeats = await released_together(
                    concurrency,
                    lambda _: client.post(
                        HEARTBEAT, json=heartbeat_body(node.node_id), headers=node.headers
                    ),
                )
                assert [r.status_code for r in heartbeats] == [200] * concurrency

                # The winner, and only the winner, is last-good state.
                detail = admin.get(f"{NODES}/{node.node_id}", headers=api.admin_headers).json()
                for stream in ("inventory_stream", "telemetry_stream"):
                    assert detail[stream]["cursor"] == sequence
                    assert detail[stream]["good_sequence"] == sequence
                    assert detail[stream]["not_applied_reason"] is None
                assert detail["hostname"] == hostnames[winner]
                assert detail["inventory"]["host"]["hostname"] == hostnames[winner]
                assert detail["telemetry"]["ram_used_bytes"] == 1000 + telemetry_winner
                # One GPU per round was reported by every sample, but only the applied
                # sample reconciled it: the previous round's GPU is now missing.
                gpus = {g["uuid"]: g["missing"] for g in detail["gpus"]}
                assert gpus == {f"GPU-seq-{s}": s != sequence for s in range(1, sequence + 1)}
                assert detail["last_heartbeat_at"] is not None

        added = admin.get(
            AUDIT, headers=api.admin_headers, params={"action": "node.gpu.added"}
        ).json()["items"]
        assert sorted(row["details"]["gpu_uuid"] for row in added) == [
            f"GPU-seq-{s}" for s in range(1, 4)
        ]


# ------------------------------------------------------- the changing process, at once


@pytest.fixture
def held_notifications(api: RunningApi, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The API's node cache gets no NOTIFY for the rest of the test: each one is kept
    here, unapplied. What it then refuses, it refuses without them (api/node_cache.py)."""
    held: list[str] = []
    monkeypatch.setattr(api.state.node_cache, "_on_payload", held.append)
    return held


def test_the_rotating_process_refuses_the_old_credential_at_once(
    api: RunningApi, held_notifications: list[str]
) -> None:
    """Rotate, then at once present the rotated-away credential to the same process,
    whose cache held it: refused every time, with its own NOTIFY held back."""
    with api.client() as client:
        node = enroll(client, api)
        rotate = f"{NODES}/{node.node_id}/credential/rotate"
        for _ in range(ROTATIONS):
            answered_from_cache(client, node)
            rotated = client.post(rotate, headers=api.admin_headers)
            assert rotated.status_code == 200, rotated.text
            old = client.post(HEARTBEAT, json=heartbeat_body(node.node_id), headers=node.headers)
            assert (old.status_code, old.json().get("code")) == (401, "credential_revoked")
            node = EnrolledNode(node.node_id, rotated.json()["credential"])
        # The notifications did come, and none of them was applied.
        wait_until(lambda: node.node_id in held_notifications, 5, "the rotations' NOTIFY")


@pytest.mark.parametrize(("change", "status", "code"), REFUSALS)
def test_the_changing_process_refuses_at_once(
    api: RunningApi, held_notifications: list[str], change: str, status: int, code: str
) -> None:
    with api.client() as client:
        node = enroll(client, api)
        answered_from_cache(client, node)
        refuse(client, node.node_id, change)
        for route in (HEARTBEAT, TELEMETRY):
            if route == HEARTBEAT:
                body = heartbeat_body(node.node_id)
                response = client.post(route, json=body, headers=node.headers)
            else:
                body = telemetry_body(node.node_id, 1)
                response = client.put(route, json=body, headers=node.headers)
            assert (response.status_code, response.json().get("code")) == (status, code)
        wait_until(lambda: node.node_id in held_notifications, 5, "the change's NOTIFY")
