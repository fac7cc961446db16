"""Telemetry group commit (api/telemetry_batch.py), raced through a real API.

Cached nodes' samples sent all at once land in shared transactions; each is decided
as if alone: one sample of a sequence is applied however many copies race, the
highest sequence always lands, and a not-applied episode is one event per node
however its samples were batched.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from datetime import timedelta

import httpx

from schemas.protocol import TELEMETRY
from tests.api_processes import cached, metric
from tests.api_server import RunningApi
from tests.flows import EnrolledNode, enroll, now, telemetry_body
from tests.services import db_fetch

NODES = 12
COPIES = 8
SEQUENCES = 6


async def _put(
    client: httpx.AsyncClient, node: EnrolledNode, body: dict[str, object]
) -> httpx.Response:
    return await client.put(TELEMETRY, json=body, headers=node.headers)


def _fleet(api: RunningApi) -> list[EnrolledNode]:
    with api.client() as client:
        nodes = [enroll(client, api, f"batch-{i}") for i in range(NODES)]
        for node in nodes:
            cached(client, node)
    return nodes


async def test_racing_copies_of_a_sample_apply_once_and_the_highest_sequence_lands(
    api: RunningApi, database_url: str
) -> None:
    nodes = _fleet(api)
    with api.client() as client:
        batches = metric(client, "modelforge_telemetry_batches_total")
        samples = metric(client, "modelforge_telemetry_batched_samples_total")
    sends = [(node, 1) for node in nodes for _ in range(COPIES)]
    sends += [(node, seq) for node in nodes for seq in range(2, SEQUENCES + 1)]
    random.shuffle(sends)
    # One observation time for all: a later sequence observed earlier than the last good
    # one would be "not applied" (a clock rule), which is not what this test races.
    observed = now()
    async with httpx.AsyncClient(base_url=api.base_url, timeout=30) as client:
        answers = await asyncio.gather(
            *(
                _put(client, node, telemetry_body(node.node_id, seq, observed_at=observed))
                for node, seq in sends
            )
        )
    applied: Counter[tuple[str, int]] = Counter()
    for (node, seq), answer in zip(sends, answers, strict=True):
        if answer.status_code == 200:
            assert answer.json()["applied"] is True
            applied[(node.node_id, seq)] += 1
        else:
            assert answer.status_code == 409, answer.text
            assert answer.json()["code"] == "sequence_replayed"
            assert answer.json()["extra"]["cursor"] >= seq
    # No sample applied twice; the highest sequence of every node always lands.
    assert max(applied.values()) == 1
    assert all(applied[(node.node_id, SEQUENCES)] == 1 for node in nodes)
    rows = await db_fetch(
        database_url,
        "SELECT cursor, good_sequence FROM node_streams WHERE stream = 'telemetry'"
        " AND node_id::text = ANY($1)",
        [node.node_id for node in nodes],
    )
    assert [(r["cursor"], r["good_sequence"]) for r in rows] == [(SEQUENCES, SEQUENCES)] * NODES
    with api.client() as client:
        written = metric(client, "modelforge_telemetry_batched_samples_total") - samples
        transactions = metric(client, "modelforge_telemetry_batches_total") - batches
    assert written == len(sends)  # replays too: each was decided in a batch
    assert transactions < written, "racing samples shared transactions"


async def test_a_not_applied_episode_is_one_event_per_node_however_batched(
    api: RunningApi, database_url: str
) -> None:
    nodes = _fleet(api)
    ahead = now() + timedelta(hours=1)  # past the future-skew limit
    sends = [(node, seq) for node in nodes for seq in range(1, SEQUENCES + 1)]
    random.shuffle(sends)
    async with httpx.AsyncClient(base_url=api.base_url, timeout=30) as client:
        answers = await asyncio.gather(
            *(
                _put(client, node, telemetry_body(node.node_id, seq, observed_at=ahead))
                for node, seq in sends
            )
        )
    for answer in answers:
        if answer.status_code == 200:
            assert answer.json()["applied"] is False
            assert answer.json()["reason"] == "observed_in_future"
        else:
            assert answer.json()["code"] == "sequence_replayed", answer.text

    async def one_each() -> bool:
        rows = await db_fetch(
            database_url,
            "SELECT envelope->'data'->>'node_id' AS node FROM outbox"
            " WHERE envelope->>'action' = 'node.stream.not_applied'"
            " AND envelope->'data'->>'node_id' = ANY($1)",
            [node.node_id for node in nodes],
        )
        return sorted(r["node"] for r in rows) == sorted(node.node_id for node in nodes)

    # Written in the batches' own transactions: there by the time the answers are.
    assert await one_each()
