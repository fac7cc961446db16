"""The event catalog downstream consumers read: docs/events.md, generated from schemas/events.py."""

from __future__ import annotations

from schemas.events import EVENT_MEANINGS, EVENT_PAYLOADS, SUBJECT_IDS, SUBJECT_PREFIX, EventType
from schemas.protocol import EVENTS_STREAM as STREAM

_HEADER = f"""# Event catalog

Generated from `schemas/events.py` by `modelforge events catalog docs/events.md`; a test
fails when it is stale.

Every event is a [CloudEvents 1.0](https://cloudevents.io) JSON document in structured
mode (`schemas/jsonschema/events.CloudEvent.json`), published on the JetStream stream
`{STREAM}` (subjects `{SUBJECT_PREFIX}.>`), with the `Nats-Msg-Id` header equal to the
event `id`. Extension attributes: `correlationid` (the API request or worker message
that caused it) and `nodeid`.

**Delivery: at least once.** Events are written to a transactional outbox in the same
transaction as the change they describe, so a committed change always produces its event
and a rolled-back one never does. A relay publishes them; JetStream drops a republished
copy within the stream's duplicate window (120 s). A copy can only reach a consumer twice
if a publish acknowledgement was lost *and* the outage outlasted that window, so
consumers should still treat `id` as an idempotency key.

**Order: per node, in commit order.** Every transaction that emits events for a node
holds that node's lock, and the relay publishes in outbox order, so the events of one node
arrive in the order their changes committed. There is no order across nodes.

**Attach a consumer** with any JetStream client: a durable pull consumer on `{STREAM}`
with a filter subject, explicit acks, `DeliverPolicy.ALL` to replay from the start.
`ops/examples/node_events_consumer.py` is one to copy; `modelforge events tail` prints
events as they arrive.

Subject filters: one node `{SUBJECT_PREFIX}.node.<node_id>.>`; one kind of event on all
nodes, e.g. `{SUBJECT_PREFIX}.node.*.gpu.missing`.

| type | meaning | subject | payload schema |
|---|---|---|---|
"""


def render() -> str:
    rows = []
    for event_type in EventType:
        kind, _, rest = event_type.value.partition(".")
        subject = f"`{SUBJECT_PREFIX}.{kind}.<{SUBJECT_IDS[kind]}>.{rest}`"
        model = EVENT_PAYLOADS[event_type]
        payload = model.__name__
        module = model.__module__.rsplit(".", 1)[-1]
        schema = f"[`{payload}`](../schemas/jsonschema/{module}.{payload}.json)"
        meaning = EVENT_MEANINGS[event_type]
        rows.append(f"| `{event_type.cloudevent_type}` | {meaning} | {subject} | {schema} |")
    return _HEADER + "\n".join(rows) + "\n"
