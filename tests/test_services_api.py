"""Model services' admin resource (/api/v1/admin/services) against the real API,
PostgreSQL and a local server that speaks the Hub layout (tests/hub_server.py): the
artifact's revision resolved to an exact commit and the memory estimate made from the
GGUF header the source serves (the file's size when it serves none); the refusals; one
live service per name under a race; scale, rollout, undo and delete, each one change
with one event that reaches the audit log."""

from __future__ import annotations

import asyncio
import hashlib
import json
import struct
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import gguf
import httpx
import pytest

from api.model_headers import ModelHeaders
from schemas.protocol import SERVICES
from tests.admin_helpers import audit, ok, refused
from tests.agent.harness import wait_until
from tests.api_server import ApiFactory, RunningApi
from tests.flows import enroll, released_together
from tests.hub_server import HubServer
from tests.runtime_flows import create_profile
from tests.service_api_flows import (
    COMMIT,
    COMMIT_V2,
    FILES,
    REPO,
    TENSOR_BYTES,
    add_replica,
    db_value,
    hostile_gguf,
    service_body,
    service_events,
)


@pytest.fixture
def services_api(api_factory: ApiFactory, hub: HubServer) -> RunningApi:
    hub.state.add(REPO, "main", COMMIT, FILES)
    hub.state.add(REPO, "v2", COMMIT_V2, {**FILES, "model.gguf": FILES["model.gguf"] + b"\0" * 64})
    return api_factory(artifact_source_url=hub.url)


def create(client: httpx.Client, api: RunningApi, body: dict[str, Any]) -> httpx.Response:
    return client.post(SERVICES, json=body, headers=api.admin_headers)


def act(
    client: httpx.Client, api: RunningApi, service_id: str, action: str, **body: Any
) -> httpx.Response:
    return client.post(f"{SERVICES}/{service_id}/{action}", json=body, headers=api.admin_headers)


def get(client: httpx.Client, api: RunningApi, service_id: str, **params: Any) -> dict[str, Any]:
    found: dict[str, Any] = ok(
        client.get(f"{SERVICES}/{service_id}", params=params, headers=api.admin_headers)
    )
    return found


# ------------------------------------------------------------------------------ create


def test_a_service_resolves_its_revision_and_estimates_from_the_gguf_header(
    services_api: RunningApi,
) -> None:
    api = services_api
    with api.client() as client:
        profile = create_profile(client, api)
        service = ok(create(client, api, service_body(profile["id"], replicas=2)), 201)
        artifact = service["template"]["artifact"]
        data = FILES["model.gguf"]
        assert artifact == {
            "repository": REPO,
            "revision": "main",
            "commit": COMMIT,
            "path": "model.gguf",
            "size_bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
        estimate = service["template"]["estimate"]
        assert estimate["source"] == "gguf_header"
        assert estimate["weights_bytes"] == TENSOR_BYTES
        assert estimate["context_size"] == 512  # the profile's ctx_size
        assert estimate["total_bytes"] > estimate["weights_bytes"]
        assert service["template"]["profile_id"] == profile["id"]
        assert service["template"]["profile_version"] == 1
        assert service["state"] == "active" and service["generation"] == 1
        assert service["replicas"] == 2 and service["ready_replicas"] == 0
        assert service["rollout"] == {
            "state": "complete",
            "generation": 1,
            "updated_ready": 0,
            "desired": 2,
            "outdated": 0,
            "reason": None,
            "started_at": None,
        }
        assert service["items"] == []
        assert get(client, api, service["id"]) == service
        listed = ok(client.get(SERVICES, headers=api.admin_headers))["items"]
        assert [s["id"] for s in listed] == [service["id"]]
        assert "items" not in listed[0]
    assert service_events(api, service["id"]) == [("service.created", "created")]
    with api.client() as client:
        [entry] = audit(client, api, target_type="service", target_id=service["id"])
    assert entry["action"] == "service.created" and entry["actor"] == "operator"


def test_an_unreadable_header_falls_back_to_the_file_size(services_api: RunningApi) -> None:
    api = services_api
    with api.client() as client:
        profile = create_profile(client, api)
        body = service_body(profile["id"], path="notes.gguf")
        service = ok(create(client, api, body), 201)
    estimate = service["template"]["estimate"]
    assert estimate["source"] == "file_size"
    assert estimate["weights_bytes"] == len(FILES["notes.gguf"])
    # Below the LFS threshold the source gives a git blob id, no sha256.
    assert service["template"]["artifact"]["sha256"] is None


HOSTILE_HEADERS = {
    # Tensors of 2^64 elements a side: their bytes past any integer the wire carries.
    "huge.gguf": hostile_gguf({"general.architecture": "llama"}, (2**64 - 1,) * 4),
    # A negative layer count: the KV cache would come out negative.
    "negative.gguf": hostile_gguf(
        {
            "general.architecture": "llama",
            "llama.block_count": -5,
            "llama.embedding_length": 64,
            "llama.attention.head_count": 4,
        }
    ),
    # An architecture name as long as the summary keeps: the estimate's detail overflows.
    "named.gguf": hostile_gguf({"general.architecture": "a" * 256}),
    # A trained context of 2^63 tokens, which a profile's ctx_size 0 takes as its own.
    "context.gguf": hostile_gguf(
        {
            "general.architecture": "llama",
            "llama.context_length": 2**63,
            "llama.block_count": 32,
            "llama.embedding_length": 4096,
            "llama.attention.head_count": 32,
        }
    ),
}


def test_a_header_claiming_absurd_sizes_is_estimated_from_the_file_size(
    services_api: RunningApi, hub: HubServer
) -> None:
    """The header comes from an untrusted source: values no model has (sizes past what
    the wire carries, negative counts, a long name) are a header we cannot use, so the
    estimate is the file's size, as for one we cannot read (was a 500)."""
    api = services_api
    hub.state.add("acme/hostile", "main", COMMIT, HOSTILE_HEADERS)
    with api.client() as client:
        profile = create_profile(client, api, ctx_size=0)
        for path, data in HOSTILE_HEADERS.items():
            body = service_body(profile["id"], name=path.removesuffix(".gguf"))
            body["artifact"] = {"repository": "acme/hostile", "path": path}
            service = ok(create(client, api, body), 201)
            estimate = service["template"]["estimate"]
            assert estimate["source"] == "file_size", path
            assert estimate["weights_bytes"] == len(data)


def test_a_source_claiming_an_absurd_file_size_is_refused(
    services_api: RunningApi, hub: HubServer
) -> None:
    """A file of 2^53 - 1 bytes (8 PiB) per the source's tree: no estimate of it fits the
    wire's integers, and no device holds it; its header (not a GGUF) gives no other
    figure. 502 source_invalid (was a 500)."""
    api = services_api
    entry = {"type": "file", "path": "notes.gguf", "size": 2**53 - 1, "oid": "0" * 40}
    hub.state.raw_answers[f"/api/models/{REPO}/tree/{COMMIT}"] = json.dumps([entry]).encode()
    with api.client() as client:
        profile = create_profile(client, api)
        body = service_body(profile["id"], path="notes.gguf")
        refused(create(client, api, body), 502, "source_invalid")
        assert ok(client.get(SERVICES, headers=api.admin_headers))["items"] == []


def test_a_slow_source_costs_the_header_timeout_not_the_file(
    api_factory: ApiFactory, hub: HubServer
) -> None:
    """A source that trickles the file (every chunk inside the socket's timeout) is given
    model_header_timeout_s for a read, as the setting says, then the estimate is the
    file's size: before, a create waited for the whole prefix (here about 100 s). The
    bound leaves a loaded box room (one CI run took 13 s where 4 s is usual; the cause
    was not found) and stays far from the prefix's time."""
    padded = FILES["model.gguf"] + b"\0" * (800 * 1024)
    hub.state.add(REPO, "main", COMMIT, {"model.gguf": padded})
    hub.state.throttle["model.gguf"] = 8 * 1024  # a 16 KiB chunk each 2 s
    api = api_factory(artifact_source_url=hub.url, model_header_timeout_s=3.0)
    with api.client() as client:
        profile = create_profile(client, api)
        started = time.monotonic()
        service = ok(create(client, api, service_body(profile["id"])), 201)
        took = time.monotonic() - started
    assert service["template"]["estimate"]["source"] == "file_size"
    assert took < 30.0, took


def _tokenizer_of_empty_strings(count: int) -> bytes:
    """A GGUF header whose tokenizer is `count` empty strings (8 bytes each, the most a
    32 MiB prefix holds of anything the parser walks one by one)."""
    key = b"tokenizer.ggml.tokens"
    header = struct.pack("<IIQQ", gguf.GGUF_MAGIC, 3, 0, 1)
    header += struct.pack("<Q", len(key)) + key
    header += struct.pack("<IIQ", gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING, count)
    return header + b"\0" * 8 * count


async def test_a_header_that_takes_seconds_to_walk_does_not_stall_the_api(
    hub: HubServer,
) -> None:
    """Walking a hostile header within the bounds (four million strings in 32 MiB) takes
    seconds of CPU; done on the event loop it stalled every request the API process
    serves meanwhile (agents' heartbeats, the gateway's streams). It runs in a thread:
    the loop keeps turning."""
    data = _tokenizer_of_empty_strings(4_000_000)
    hub.state.add(REPO, "main", COMMIT, {"model.gguf": data})
    headers = ModelHeaders(hub.url, None, 30.0, 32 * 1024 * 1024)
    gaps: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.monotonic()
        while not done.is_set():
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticking = asyncio.create_task(ticker())
    try:
        summary = await headers.summary(REPO, COMMIT, "model.gguf")
    finally:
        done.set()
        await ticking
        await headers.close()
    assert summary is not None and summary.vocab_size == 4_000_000
    assert max(gaps) < 0.5, f"the event loop stalled {max(gaps):.2f} s"


def test_refusals_are_typed(
    services_api: RunningApi, api_factory: ApiFactory, hub: HubServer
) -> None:
    api = services_api
    ghost = str(uuid.uuid4())
    with api.client() as client:
        profile = create_profile(client, api)
        body = service_body(profile["id"])
        refused(client.post(SERVICES, json=body), 401, "admin_token_missing")
        refused(client.get(SERVICES), 401, "admin_token_missing")
        refused(client.get(f"{SERVICES}/{ghost}", headers=api.admin_headers), 404, "not_found")
        refused(act(client, api, ghost, "scale", replicas=1), 404, "not_found")
        refused(act(client, api, ghost, "rollout", max_concurrent=2), 404, "not_found")
        refused(act(client, api, ghost, "rollout/undo"), 404, "not_found")
        refused(
            client.get(f"{SERVICES}/{ghost}/rollout", headers=api.admin_headers), 404, "not_found"
        )
        refused(client.delete(f"{SERVICES}/{ghost}", headers=api.admin_headers), 404, "not_found")
        refused(create(client, api, {**body, "profile_id": ghost}), 404, "profile_unknown")
        refused(create(client, api, {**body, "environment_id": ghost}), 404, "environment_unknown")
        for broken in (
            {**body, "replicas": -1},
            {**body, "name": ""},
            {key: value for key, value in body.items() if key != "artifact"},
            {**body, "autoscale": {"min_replicas": 3, "max_replicas": 2}},
            {**body, "artifact": {**body["artifact"], "path": "../etc/passwd"}},
            {**body, "placement": {"max_per_node": 0}},
            {**body, "surprise": True},
        ):
            refused(create(client, api, broken), 422, "validation_failed")
        wrong_revision = {**body, "artifact": {**body["artifact"], "revision": "nope"}}
        refused(create(client, api, wrong_revision), 422, "manifest_unresolved")
        no_file = {**body, "artifact": {**body["artifact"], "path": "absent.gguf"}}
        refused(create(client, api, no_file), 422, "manifest_unresolved")
        # A path with a glob's characters names that one file, never a pattern.
        starred = {**body, "artifact": {**body["artifact"], "path": "*.gguf"}}
        refused(create(client, api, starred), 422, "manifest_unresolved")
        # A profile stored before its flags were refused (behind the API's back, as an
        # earlier version would have stored it) is refused before the source is asked.
        old = create_profile(client, api, name="old")
        hostile = json.dumps({"server_args": {"agent": True, "tools": "all"}})
        db_value(
            api,
            "UPDATE runtime_profiles SET settings = $1::jsonb WHERE id = $2 RETURNING id",
            hostile,
            uuid.UUID(old["id"]),
        )
        asked = len(hub.state.requests)
        flagged = refused(
            create(client, api, {**body, "profile_id": old["id"]}), 422, "server_flag_refused"
        )
        assert sorted(flagged["extra"]["flags"]) == ["agent", "tools"]
        assert len(hub.state.requests) == asked
        # A source that answers what we do not read: 502, as for an artifact job.
        hub.state.raw_answers[f"/api/models/{REPO}/revision/garbled"] = b"[1, 2"
        garbled = {**body, "artifact": {**body["artifact"], "revision": "garbled"}}
        refused(create(client, api, garbled), 502, "source_invalid")
        assert ok(client.get(SERVICES, headers=api.admin_headers))["items"] == []
    offline = api_factory()  # its source is a closed port
    with offline.client() as client:
        profile = create_profile(client, offline, name="offline")
        refused(create(client, offline, service_body(profile["id"])), 503, "source_unavailable")


def test_embeddings_on_a_profile_with_split_kv_buffers_are_refused_at_declaration(
    services_api: RunningApi, hub: HubServer
) -> None:
    """A profile that sets no-kv-unified cannot serve embeddings (the node refuses to
    start it: schemas/llama_flags.py endpoint_refusals); the API says so when the
    service is declared or rolled out to embeddings, before the source is asked, not as
    replicas that fail on every node."""
    api = services_api
    with api.client() as client:
        split_kv = {"pooling": "mean", "no-kv-unified": True}
        split = create_profile(client, api, name="split", server_args=split_kv)
        asked = len(hub.state.requests)
        body = service_body(split["id"], endpoints=["chat", "embeddings"])
        flagged = refused(create(client, api, body), 422, "server_flag_refused")
        assert flagged["extra"]["flags"] == ["no-kv-unified"]
        assert "embeddings need the unified KV cache" in flagged["message"]
        assert len(hub.state.requests) == asked
        assert ok(client.get(SERVICES, headers=api.admin_headers))["items"] == []
        # Chat alone keeps the operator's choice of KV buffers.
        service = ok(create(client, api, service_body(split["id"])), 201)
        assert service["template"]["endpoints"] == ["chat", "completions"]
        # A rollout that adds embeddings on that profile is refused; nothing changes.
        rolled = act(client, api, service["id"], "rollout", endpoints=["embeddings"])
        assert refused(rolled, 422, "server_flag_refused")["extra"]["flags"] == ["no-kv-unified"]
        unified = create_profile(client, api, name="unified", server_args={"pooling": "mean"})
        moved = act(client, api, service["id"], "rollout", endpoints=["embeddings"],
                    profile_id=unified["id"])  # fmt: skip
        assert ok(moved)["generation"] == 2
        # And back to the split profile while serving embeddings: refused too.
        back = act(client, api, service["id"], "rollout", profile_id=split["id"])
        refused(back, 422, "server_flag_refused")
        assert (
            ok(client.get(f"{SERVICES}/{service['id']}", headers=api.admin_headers))["generation"]
            == 2
        )


async def test_one_live_service_per_name_under_a_race(services_api: RunningApi) -> None:
    api = services_api
    with api.client() as client:
        profile = create_profile(client, api)
    body = service_body(profile["id"], name="raced")
    async with api.async_client() as client:
        responses = await released_together(
            8, lambda _: client.post(SERVICES, json=body, headers=api.admin_headers)
        )
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [201] + [409] * 7, [r.text for r in responses]
    for response in responses:
        if response.status_code == 409:
            assert response.json()["code"] == "state_conflict"
    assert db_value(api, "SELECT count(*) FROM services WHERE name = 'raced'") == 1


# ------------------------------------------------------------------------------ changes


def test_scale_rollout_undo_and_delete_each_one_event(services_api: RunningApi) -> None:
    api = services_api
    with api.client() as client:
        profile = create_profile(client, api)
        node = enroll(client, api)
        service = ok(create(client, api, service_body(profile["id"])), 201)
        service_id = service["id"]

        scaled = ok(act(client, api, service_id, "scale", replicas=3))
        assert scaled["replicas"] == 3 and scaled["rollout"]["desired"] == 3
        # The same count again: no change, no event.
        assert ok(act(client, api, service_id, "scale", replicas=3))["replicas"] == 3
        refused(act(client, api, service_id, "scale", replicas=1001), 422, "validation_failed")

        # A replica of generation 1, ready, as the reconciler would have placed it.
        first = add_replica(api, service_id, node.node_id, "gpu0", generation=1, phase="ready")
        assert get(client, api, service_id)["ready_replicas"] == 1

        rolled = ok(act(client, api, service_id, "rollout", artifact=_artifact("v2")))
        assert rolled["generation"] == 2
        assert rolled["template"]["artifact"]["commit"] == COMMIT_V2
        assert rolled["template"]["estimate"]["source"] == "gguf_header"
        assert rolled["rollout"]["state"] == "progressing"
        assert rolled["rollout"]["reason"] == "rollout"
        assert rolled["rollout"]["started_at"] is not None
        assert rolled["rollout"]["updated_ready"] == 0 and rolled["rollout"]["outdated"] == 1
        status = ok(client.get(f"{SERVICES}/{service_id}/rollout", headers=api.admin_headers))
        assert status == rolled["rollout"]
        # The same template again (v2 still resolves to the same commit): refused.
        same = refused(
            act(client, api, service_id, "rollout", artifact=_artifact("v2")),
            409,
            "state_conflict",
        )
        assert same["extra"]["generation"] == 2
        refused(act(client, api, service_id, "rollout"), 422, "validation_failed")
        refused(
            act(client, api, service_id, "rollout", profile_id=str(uuid.uuid4())),
            404,
            "profile_unknown",
        )
        # A replica of the new generation, loading.
        add_replica(api, service_id, node.node_id, "gpu1", generation=2, phase="loading")

        undone = ok(act(client, api, service_id, "rollout/undo"))
        assert undone["generation"] == 3
        assert undone["template"]["artifact"]["commit"] == COMMIT
        assert undone["rollout"]["reason"] == "undo"
        # The generation-1 replica runs generation 3's template already: relabelled.
        replicas = {r["id"]: r for r in undone["items"]}
        assert replicas[first]["generation"] == 3
        assert undone["rollout"]["updated_ready"] == 1 and undone["rollout"]["outdated"] == 1
        # Undo again: back to v2, whose loading replica is relabelled in turn.
        again = ok(act(client, api, service_id, "rollout/undo"))
        assert again["generation"] == 4
        assert again["template"]["artifact"]["commit"] == COMMIT_V2
        assert sorted(r["generation"] for r in again["items"]) == [3, 4]

        profile_2 = create_profile(client, api, name="bigger", ctx_size=1024)
        moved = ok(act(client, api, service_id, "rollout", profile_id=profile_2["id"]))
        assert moved["generation"] == 5
        assert moved["template"]["estimate"]["context_size"] == 1024
        assert moved["template"]["artifact"]["commit"] == COMMIT_V2

        deleting = client.delete(f"{SERVICES}/{service_id}", headers=api.admin_headers)
        assert ok(deleting, 202)["state"] == "deleting"
        # Deleting again: the same answer, no second event.
        assert (
            ok(client.delete(f"{SERVICES}/{service_id}", headers=api.admin_headers), 202)["state"]
            == "deleting"
        )
        refused(act(client, api, service_id, "scale", replicas=2), 409, "state_conflict")
        refused(act(client, api, service_id, "rollout", max_concurrent=2), 409, "state_conflict")
        refused(act(client, api, service_id, "rollout/undo"), 409, "state_conflict")
        # Its name is still taken while it drains.
        refused(create(client, api, service_body(profile["id"])), 409, "state_conflict")
    assert service_events(api, service_id) == [
        ("service.created", "created"),
        ("service.changed", "scaled"),
        ("service.changed", "rollout"),
        ("service.changed", "undo"),
        ("service.changed", "undo"),
        ("service.changed", "rollout"),
        ("service.changed", "deleting"),
    ]
    with api.client() as client:
        audited = audit(client, api, target_type="service", target_id=service_id)
    assert sorted(e["action"] for e in audited) == sorted(
        ["service.created"] + ["service.changed"] * 6
    )


def test_after_a_stopped_rollout_the_previous_template_stays_the_serving_one(
    services_api: RunningApi,
) -> None:
    """A rollout stopped (its new replica failed): the old replicas keep serving. A
    second rollout then must not make the failed template the 'previous' one: the
    reconciler replaces a lost replica with the previous template while a rollout is
    stopped, and an undo goes back to it, so both would bring back the template that
    never served. The previous one stays the serving one; an undo relabels its
    replicas."""
    api = services_api
    with api.client() as client:
        profile = create_profile(client, api)
        node = enroll(client, api)
        service_id = ok(create(client, api, service_body(profile["id"])), 201)["id"]
        serving = add_replica(api, service_id, node.node_id, "gpu0", generation=1, phase="ready")
        ok(act(client, api, service_id, "rollout", max_concurrent=8))
        # Its new replica failed: the reconciler stopped the rollout.
        db_value(
            api,
            "UPDATE services SET rollout_state = 'stopped' WHERE id = $1 RETURNING id",
            uuid.UUID(service_id),
        )
        fixed = ok(act(client, api, service_id, "rollout", max_concurrent=16))
        assert fixed["generation"] == 3
        assert (
            db_value(
                api, "SELECT previous_generation FROM services WHERE id = $1", uuid.UUID(service_id)
            )
            == 1
        )
        undone = ok(act(client, api, service_id, "rollout/undo"))
        assert undone["generation"] == 4
        assert undone["template"]["max_concurrent"] == 4
        [replica] = undone["items"]
        assert replica["id"] == serving and replica["generation"] == 4
        assert undone["rollout"]["updated_ready"] == 1 and undone["rollout"]["outdated"] == 0


def test_a_rollout_built_on_a_template_changed_meanwhile_is_refused(
    services_api: RunningApi, hub: HubServer
) -> None:
    """A rollout's template is the current one with what the body names, built before
    the row's lock (the source is asked in between). Another rollout committed meanwhile
    would be silently undone by it (a lost update: here its max_concurrent); it is
    refused 409 instead, and the operator retries on the new template."""
    api = services_api
    slow = FILES["model.gguf"] + b"\0" * (64 * 1024)
    hub.state.add(REPO, "v3", "3" * 40, {"slow.gguf": slow})
    hub.state.throttle["slow.gguf"] = 16 * 1024  # a 16 KiB chunk a second: ~4 s
    with api.client() as client, ThreadPoolExecutor(1) as pool:
        profile = create_profile(client, api)
        service_id = ok(create(client, api, service_body(profile["id"])), 201)["id"]
        artifact = {"repository": REPO, "revision": "v3", "path": "slow.gguf"}

        def artifact_rollout() -> httpx.Response:
            with api.client() as other:
                return act(other, api, service_id, "rollout", artifact=artifact)

        slowly = pool.submit(artifact_rollout)
        # It has read the template and asks the source for the new file's header.
        wait_until(lambda: any(path == "slow.gguf" for path, _ in hub.state.ranges), 20)
        assert not slowly.done()
        ok(act(client, api, service_id, "rollout", max_concurrent=8))
        stale = slowly.result(timeout=60)
        refused(stale, 409, "state_conflict")
        current = get(client, api, service_id)
        assert current["generation"] == 2
        assert current["template"]["max_concurrent"] == 8
        assert current["template"]["artifact"]["commit"] == COMMIT
        # On the new template the same rollout goes through, keeping max_concurrent.
        hub.state.throttle.pop("slow.gguf")
        rolled = ok(act(client, api, service_id, "rollout", artifact=artifact))
        assert rolled["generation"] == 3
        assert rolled["template"]["max_concurrent"] == 8
        assert rolled["template"]["artifact"]["path"] == "slow.gguf"


def test_autoscale_clamps_an_operators_count(services_api: RunningApi) -> None:
    api = services_api
    with api.client() as client:
        profile = create_profile(client, api)
        body = service_body(
            profile["id"], replicas=9, autoscale={"min_replicas": 1, "max_replicas": 3}
        )
        service = ok(create(client, api, body), 201)
        assert service["replicas"] == 3
        assert ok(act(client, api, service["id"], "scale", replicas=0))["replicas"] == 1
        assert ok(act(client, api, service["id"], "scale", replicas=2))["replicas"] == 2


def test_undo_without_a_previous_template_is_refused(services_api: RunningApi) -> None:
    api = services_api
    with api.client() as client:
        profile = create_profile(client, api)
        service = ok(create(client, api, service_body(profile["id"])), 201)
        refused(act(client, api, service["id"], "rollout/undo"), 409, "state_conflict")


def test_lists_filter_and_ended_replicas_show_on_request(services_api: RunningApi) -> None:
    api = services_api
    with api.client() as client:
        profile = create_profile(client, api)
        node = enroll(client, api)
        one = ok(create(client, api, service_body(profile["id"], name="one")), 201)
        two = ok(create(client, api, service_body(profile["id"], name="two")), 201)
        ok(client.delete(f"{SERVICES}/{two['id']}", headers=api.admin_headers), 202)

        def names(**params: Any) -> list[str]:
            items = ok(client.get(SERVICES, params=params, headers=api.admin_headers))["items"]
            return [s["name"] for s in items]

        assert names() == ["two", "one"]
        assert names(state="deleting") == ["two"]
        assert names(state=["active", "deleting"]) == ["two", "one"]
        assert names(name="one") == ["one"]
        assert names(limit=1) == ["two"] and names(limit=1, offset=1) == ["one"]
        refused(
            client.get(SERVICES, params={"state": "gone"}, headers=api.admin_headers),
            422,
            "validation_failed",
        )
        live = add_replica(api, one["id"], node.node_id, "gpu0", generation=1, phase="ready")
        ended = add_replica(api, one["id"], node.node_id, "gpu1", generation=1, phase="ended")
        assert [r["id"] for r in get(client, api, one["id"])["items"]] == [live]
        shown = get(client, api, one["id"], ended="true")["items"]
        assert sorted(r["id"] for r in shown) == sorted([live, ended])
        # Ended replicas are bounded, newest first; the live ones are always all there.
        newer = add_replica(api, one["id"], node.node_id, "gpu2", generation=1, phase="ended")
        bounded = get(client, api, one["id"], ended="true", ended_limit="1")["items"]
        assert [r["id"] for r in bounded] == [live, newer]


def _artifact(revision: str) -> dict[str, str]:
    return {"repository": REPO, "revision": revision, "path": "model.gguf"}
