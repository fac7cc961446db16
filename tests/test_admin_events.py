"""The operators' event stream (GET ADMIN_EVENTS): an admin action reaches an open
stream over the real relay and NATS, its filters hold, it needs the operator key, and a
viewer that falls behind is dropped with `event: overflow` without holding up another."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest

from api.event_fanout import EventFanout, EventFilter
from cli.admin.client import AdminClient, Target
from schemas.events import CloudEvent, EventType
from schemas.protocol import ADMIN_EVENTS, ADMIN_EVENTS_OVERFLOW
from tests.admin_helpers import patch_node, refused, watching
from tests.api_server import OPERATOR_KEY, RunningApi
from tests.flows import TOKENS, enroll


async def test_an_admin_action_arrives_on_the_stream(api: RunningApi) -> None:
    async with watching(api) as stream:
        with api.client() as client:
            created = client.post(TOKENS, json={"note": "watched"}, headers=api.admin_headers)
        assert created.status_code == 201, created.text
        token_id = created.json()["token"]["id"]
        event_id, event_type, data = await stream.next()
        assert event_type == EventType.TOKEN_CREATED.cloudevent_type
        event = CloudEvent.model_validate(data)
        assert str(event.id) == event_id
        assert event.action == EventType.TOKEN_CREATED.value
        assert event.targetid == token_id
        # The same request's correlation id names the cause.
        assert event.correlationid == created.headers["X-Correlation-ID"]


async def test_a_viewer_that_reconnects_with_last_event_id_gets_what_it_missed_once(
    api: RunningApi,
) -> None:
    def create(client: httpx.Client, note: str) -> str:
        created = client.post(TOKENS, json={"note": note}, headers=api.admin_headers)
        assert created.status_code == 201, created.text
        token_id: str = created.json()["token"]["id"]
        return token_id

    created_type = EventType.TOKEN_CREATED.cloudevent_type
    with api.client() as client:
        async with watching(api) as first:
            seen = create(client, "seen")
            last_id, event_type, data = await first.next()
            assert event_type == created_type and data["targetid"] == seen
        # Disconnected: these are published while nobody watches.
        missed = [create(client, f"missed-{i}") for i in range(3)]
        api.settle()
        async with watching(api, resume_after=last_id) as resumed:
            caught_up = [await resumed.next() for _ in missed]
            assert [data["targetid"] for _, _, data in caught_up] == missed
            assert {event_type for _, event_type, _ in caught_up} == {created_type}
            live = create(client, "live")
            _, _, data = await resumed.next()
            assert data["targetid"] == live
            api.settle()
            # Each once: what was replayed is not delivered again by the live stream.
            assert resumed.events.empty()
        # An id the outbox does not hold: re-read the state instead.
        async with watching(api, resume_after=str(uuid.uuid4())) as unknown:
            _, event_type, _ = await unknown.next()
            assert event_type == ADMIN_EVENTS_OVERFLOW


async def test_filters_by_node_and_type(api: RunningApi) -> None:
    with api.client() as client:
        mine = enroll(client, api, "watched-node")
        other = enroll(client, api, "other-node")
        async with (
            watching(api, node_id=mine.node_id) as by_node,
            watching(api, type="node.disabled") as by_type,
            watching(api, type=EventType.NODE_ENABLED.cloudevent_type) as by_cloud_type,
        ):
            for node in (other, mine):
                assert patch_node(client, api, node.node_id, enabled=False).status_code == 200
            assert patch_node(client, api, mine.node_id, enabled=True).status_code == 200
            # The node filter: only this node's events, in order.
            disabled = await by_node.until(EventType.NODE_DISABLED.value)
            assert str(disabled.nodeid) == mine.node_id
            enabled = await by_node.until(EventType.NODE_ENABLED.value)
            assert str(enabled.nodeid) == mine.node_id
            # The type filter: both disables, in commit order, and nothing else.
            seen = [CloudEvent.model_validate((await by_type.next())[2]) for _ in range(2)]
            assert [str(e.nodeid) for e in seen] == [other.node_id, mine.node_id]
            assert {e.action for e in seen} == {EventType.NODE_DISABLED.value}
            _, event_type, _ = await by_cloud_type.next()
            assert event_type == EventType.NODE_ENABLED.cloudevent_type
            # What the filters keep out has had time to arrive: the enable came after.
            assert by_type.events.empty()
            while not by_node.events.empty():
                assert str((await by_node.next())[2]["nodeid"]) == mine.node_id


def test_the_stream_needs_the_operator_key(api: RunningApi) -> None:
    with api.client() as client:
        refused(client.get(ADMIN_EVENTS), 401, "admin_token_missing")
        wrong = {"X-ModelForge-Admin-Token": "not-the-key"}
        refused(client.get(ADMIN_EVENTS, headers=wrong), 401, "admin_token_invalid")
        bad = client.get(ADMIN_EVENTS, params={"node_id": "x"}, headers=api.admin_headers)
        refused(bad, 422, "validation_failed")


def envelope(action: str, node_id: uuid.UUID | None = None) -> bytes:
    return json.dumps(
        {
            "id": str(uuid.uuid4()),
            "type": f"io.modelforge.{action}.v1",
            "action": action,
            "nodeid": str(node_id) if node_id else None,
        },
        indent=1,  # across lines: the stream must put it on one
    ).encode()


@pytest.mark.fast
async def test_a_slow_viewer_is_dropped_without_holding_up_another() -> None:
    # A closed port: the fan-out is driven by hand here, its subscription never forms.
    fanout = EventFanout("nats://127.0.0.1:9", queue_limit=3)
    try:
        node = uuid.uuid4()
        with (
            fanout.viewer(EventFilter()) as slow,
            fanout.viewer(EventFilter(node_id=node)) as picky,
        ):
            for _ in range(5):
                fanout.deliver(envelope("token.created"))
            fanout.deliver(envelope("node.disabled", node))
            fanout.deliver(b"not json")
            # The slow one: its three, then the overflow mark, and nothing more.
            queued = [slow.queue.get_nowait() for _ in range(slow.queue.qsize())]
            assert len(queued) == 4 and queued[-1] is None
            assert all(m is not None and "\ndata: {" in m for m in queued[:3])
            assert fanout.dropped == 1 and fanout.viewers == 1
            # The other saw its event, on one data line.
            message = picky.queue.get_nowait()
            assert message is not None
            assert "event: io.modelforge.node.disabled.v1\n" in message
            data = message.split("data: ", 1)[1].removesuffix("\n\n")
            assert "\n" not in data and json.loads(data)["nodeid"] == str(node)
        assert fanout.viewers == 0
        assert ADMIN_EVENTS_OVERFLOW == "overflow"
    finally:
        await fanout.close()


def test_the_cli_client_resumes_after_the_last_event_it_saw(api: RunningApi) -> None:
    with AdminClient(Target(api.base_url, OPERATOR_KEY)) as admin, api.client() as client:

        def create(note: str) -> str:
            created = client.post(TOKENS, json={"note": note}, headers=api.admin_headers)
            assert created.status_code == 201, created.text
            token_id: str = created.json()["token"]["id"]
            return token_id

        stream = admin.events()
        assert next(stream) == ("", "")
        create("seen")
        _, data = next(stream)
        stream.close()
        seen = CloudEvent.model_validate_json(data)
        missed = create("missed")
        api.settle()
        resumed = admin.events(last_event_id=str(seen.id))
        assert next(resumed) == ("", "")
        event_type, data = next(resumed)
        resumed.close()
    assert event_type == EventType.TOKEN_CREATED.cloudevent_type
    assert CloudEvent.model_validate_json(data).targetid == missed
