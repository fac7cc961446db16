"""What crosses the node's trust boundary from the control plane is typed and bounded,
and nothing it sends can end a node's loops: a lease whose values a node cannot take on
is refused at the parse (a Refused claim, polled on), a claim that raises for any other
reason is backed off, and a held channel that sends an endless line or a deeply nested
note is dropped and held again. A failure's detail is made printable before it is logged
or reported, so a fail report is never lost to its own detail."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from agent.client import ProtocolClient, make_http_client
from agent.errors import log_unexpected
from agent.jobs.lease import DETAIL_CHARS, Failed
from agent.jobs.loop import claim_loop
from agent.jobs.wakeups import EventReader, TooLong, bounded_lines, hold_events, note_kind
from schemas.artifacts import ArtifactJobClaim
from schemas.deployments import DeploymentClaim
from schemas.jobs import Lease
from schemas.protocol import MAX_CHANNEL_EVENT_BYTES, NOTIFICATIONS
from schemas.runtime import RuntimeClaim, RuntimeFailure, RuntimeJobFail

pytestmark = pytest.mark.fast

DIGEST = "ab" * 32
CLAIMS: TypeAdapter[Any] = TypeAdapter(DeploymentClaim)


def lease(**changes: Any) -> dict[str, Any]:
    value = {
        "lease_id": str(uuid.uuid4()),
        "epoch": 1,
        "expires_at": "2026-12-04T10:00:00Z",
        "renew_within_s": 10.0,
    }
    return value | changes


def load_claim(**spec_changes: Any) -> dict[str, Any]:
    spec = {
        "deployment_id": str(uuid.uuid4()),
        "model": "qwen2.5-0.5b",
        "device_id": "gpu:0",
        "artifact_path": "/var/lib/modelforge/artifacts/acme/m/0123/model (q4).gguf",
        "artifact_digest": DIGEST,
        "profile_id": str(uuid.uuid4()),
        "profile_version": 1,
        "settings": {},
        "loras": [{"path": "/srv/a/lora.gguf", "sha256": DIGEST, "scale": 0.5}],
        "environment_id": str(uuid.uuid4()),
        "binary_sha256": DIGEST,
        "max_concurrent": 4,
    }
    return {
        "job_id": str(uuid.uuid4()),
        "kind": "deployment.load.v1",
        "attempt": 1,
        "spec": spec | spec_changes,
        "lease": lease(),
    }


def test_a_well_formed_load_lease_is_taken() -> None:
    claim = CLAIMS.validate_python(load_claim())
    assert claim.spec.model == "qwen2.5-0.5b"
    assert claim.spec.loras[0].scale == 0.5


@pytest.mark.parametrize(
    ("field", "value"),
    [
        # The alias goes into argv and the logs, and into every runtime report.
        ("model", "evil\nmodel"),
        ("model", "-m"),
        ("model", "x" * 129),
        ("device_id", "gpu:0 --rpc"),
        ("artifact_path", "relative/model.gguf"),
        ("artifact_path", "/srv/a/../../etc/shadow"),
        ("artifact_path", "/srv/a/model\x1b[31m.gguf"),
        ("artifact_path", "/srv/a/\u202emodel.gguf"),
        ("artifact_path", "/" + "a" * 2048),
        ("binary_sha256", "not a digest"),
        ("profile_version", 0),
        ("max_concurrent", 0),
        ("max_concurrent", 100_000),
        ("loras", [{"path": "/srv/a/l.gguf", "sha256": DIGEST, "scale": float("inf")}]),
        ("loras", [{"path": "/srv/a/l.gguf", "sha256": DIGEST}] * 9),
    ],
)
def test_a_load_lease_a_node_cannot_take_on_is_refused_at_the_parse(
    field: str, value: object
) -> None:
    with pytest.raises(ValidationError):
        CLAIMS.validate_python(load_claim(**{field: value}))


@pytest.mark.parametrize(
    "changes",
    [{"epoch": 0}, {"epoch": 2**60}, {"renew_within_s": 0}, {"renew_within_s": 1e12}],
)
def test_a_lease_without_a_usable_fence_or_renewal_is_refused(changes: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        Lease.model_validate(lease(**changes))


def test_a_target_lease_bounds_its_device_and_drain_deadline() -> None:
    target: dict[str, Any] = {
        "job_id": str(uuid.uuid4()),
        "kind": "deployment.drain.v1",
        "attempt": 1,
        "spec": {"deployment_id": str(uuid.uuid4()), "device_id": "cpu", "deadline_s": 30},
        "lease": lease(),
    }
    assert CLAIMS.validate_python(target).spec.deadline_s == 30
    bad: list[dict[str, Any]] = [
        {"device_id": "cpu\n"},
        {"deadline_s": 1e9},
        {"deadline_s": float("nan")},
    ]
    for spec in bad:
        with pytest.raises(ValidationError):
            CLAIMS.validate_python(target | {"spec": target["spec"] | spec})


def test_a_runtime_lease_bounds_its_probe_and_device() -> None:
    probes: TypeAdapter[Any] = TypeAdapter(RuntimeClaim)
    device_job = {
        "job_id": str(uuid.uuid4()),
        "kind": "runtime.unload.v1",
        "attempt": 1,
        "spec": {"device_id": "gpu:1"},
        "lease": lease(),
    }
    assert probes.validate_python(device_job).spec.device_id == "gpu:1"
    with pytest.raises(ValidationError):
        probes.validate_python(device_job | {"spec": {"device_id": "../gpu"}})
    with pytest.raises(ValidationError):
        probes.validate_python(device_job | {"attempt": 0})


def test_an_eviction_lease_bounds_its_root_repository_and_paths() -> None:
    """What an eviction's lease names is what the node deletes under: every field that
    reaches a path is refused at the parse in its worst spelling."""
    evictions: TypeAdapter[Any] = TypeAdapter(ArtifactJobClaim)
    good_file = {
        "path": "model.gguf",
        "size": 10,
        "digest": {"algorithm": "sha256", "value": "a" * 64},
    }
    eviction: dict[str, Any] = {
        "job_id": str(uuid.uuid4()),
        "kind": "artifact.evict.v1",
        "attempt": 1,
        "spec": {
            "repository": "acme/m",
            "commit": "0123456789abcdef0123456789abcdef01234567",
            "files": [good_file],
            "target_root": "/var/lib/modelforge/artifacts",
        },
        "lease": lease(),
    }
    assert evictions.validate_python(eviction).spec.files[0].path == "model.gguf"
    bad: list[dict[str, Any]] = [
        {"target_root": "relative/root"},
        {"target_root": "/srv/a/../../etc"},
        {"target_root": "/srv/\u202eroot"},
        {"repository": "../etc"},
        {"repository": "acme/../../etc"},
        {"commit": "../../etc/shadow"},
        {"files": [good_file | {"path": "../../etc/shadow"}]},
        {"files": [good_file | {"path": "/etc/shadow"}]},
        {"files": [good_file | {"path": "a/\x1b[2J.gguf"}]},
        {"files": [good_file | {"size": -1}]},
    ]
    for change in bad:
        with pytest.raises(ValidationError):
            evictions.validate_python(eviction | {"spec": eviction["spec"] | change})


# The claim loop ----------------------------------------------------------------------


class RanJob:
    name = "the job"

    def __init__(self, done: asyncio.Event) -> None:
        self.done = done

    async def run(self) -> str:
        self.done.set()
        return "done"


async def test_a_claim_that_raises_is_backed_off_and_the_loop_claims_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stop, done = asyncio.Event(), asyncio.Event()
    calls = 0

    async def claim() -> RanJob | None:
        nonlocal calls
        calls += 1
        if calls <= 3:
            # What a lease with a fence of 0 raised inside claim() before it was typed.
            raise ValueError("epoch must be positive")
        return RanJob(done)

    caplog.set_level(logging.ERROR, logger="modelforge.agent.jobs")
    loop = asyncio.create_task(claim_loop("test jobs", claim, stop, poll_s=0.01))
    await asyncio.wait_for(done.wait(), 10)
    stop.set()
    await asyncio.wait_for(loop, 10)
    assert calls >= 4
    raised = [r for r in caplog.records if "raised; backing off" in r.getMessage()]
    assert len(raised) == 1, "logged once per episode, not once per poll"


def test_an_unexpected_validation_error_is_logged_by_its_fields_not_its_input(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("modelforge.test")
    try:
        Lease.model_validate(lease(epoch="secret-looking\x1b[2J"))
    except ValidationError as exc:
        with caplog.at_level(logging.ERROR, logger="modelforge.test"):
            log_unexpected(logger, "the report failed", exc)
    [record] = caplog.records
    assert record.getMessage() == "the report failed: invalid fields: epoch"
    assert record.exc_info is None


# The held channel --------------------------------------------------------------------


async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def test_lines_are_split_across_chunks_and_an_endless_one_is_refused() -> None:
    lines = [line async for line in bounded_lines(chunks(b"event: jo", b"b\r\ndata: {}\n\n"), 64)]
    assert lines == ["event: job", "data: {}", ""]
    with pytest.raises(TooLong):
        async for _ in bounded_lines(chunks(b"data: ", b"x" * 40, b"x" * 40), 64):
            pass
    with pytest.raises(TooLong):
        async for _ in bounded_lines(chunks(b"x" * 100 + b"\n"), 64):
            pass


def test_an_event_longer_than_the_bound_is_refused() -> None:
    reader = EventReader(max_bytes=100)
    reader.feed("event: invoke")
    reader.feed("data: " + "x" * 60)
    with pytest.raises(TooLong):
        reader.feed("data: " + "x" * 60)


def test_a_nested_or_oversized_note_wakes_every_loop_and_raises_nothing() -> None:
    assert note_kind("[" * 100_000 + "]" * 100_000) is None
    assert note_kind('{"kind": {"kind": "artifact.acquire.v1"}}') is None
    assert note_kind(json.dumps({"kind": "artifact.acquire.v1", "pad": "x" * 2000})) is None


class EndlessLineApi:
    """A control plane gone wrong, on a real socket: its first held request answers one
    line that never ends, the next a proper job note."""

    def __init__(self) -> None:
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n: open\n\n")
        try:
            if self.connections == 1:
                block = b"x" * 1_048_576
                for _ in range(MAX_CHANNEL_EVENT_BYTES // len(block) + 2):
                    writer.write(block)
                    await writer.drain()
            else:
                note = {"event": "job.created", "job_id": "j", "kind": "artifact.acquire.v1"}
                writer.write(f"event: job\ndata: {json.dumps(note)}\n\n".encode())
                await writer.drain()
                await asyncio.sleep(30)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    def __enter__(self) -> EndlessLineApi:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            self.server.close()


@pytest.fixture
def endless_api() -> Iterator[EndlessLineApi]:
    with EndlessLineApi() as api:
        yield api


async def test_a_channel_that_sends_an_endless_line_is_dropped_and_held_again(
    endless_api: EndlessLineApi,
) -> None:
    endless_api.server = await asyncio.start_server(endless_api.serve, "127.0.0.1", 0)
    port = endless_api.server.sockets[0].getsockname()[1]
    stop = asyncio.Event()
    events: list[tuple[str | None, str]] = []
    noted = asyncio.Event()

    def on_event(event: str | None, data: str) -> None:
        events.append((event, data))
        noted.set()

    async with make_http_client(f"http://127.0.0.1:{port}", trust_env=False) as http:
        client = ProtocolClient(http, "mfn_test")
        holding = asyncio.create_task(
            hold_events(client, [NOTIFICATIONS], stop, on_open=lambda: None,
                        on_event=on_event, what="test channel")
        )  # fmt: skip
        await asyncio.wait_for(noted.wait(), 30)
        stop.set()
        holding.cancel()
        await asyncio.gather(holding, return_exceptions=True)
    assert endless_api.connections >= 2
    assert [note_kind(data) for event, data in events if event == "job"] == ["artifact.acquire.v1"]


# Failure details ----------------------------------------------------------------------


def test_a_failure_detail_is_made_one_printable_line_the_fail_report_takes() -> None:
    quoted = "cannot open /srv/a/model.gguf\n\x1b[31mFAKE LOG LINE\u202e" + "x" * 900
    failure = Failed(RuntimeFailure.ARTIFACT_MISSING, quoted, retryable=False)
    assert "\n" not in failure.detail and "\x1b" not in failure.detail
    assert failure.detail.startswith("cannot open /srv/a/model.gguf\\n\\x1b[31mFAKE")
    assert len(failure.detail) == DETAIL_CHARS
    report = RuntimeJobFail(
        lease={"lease_id": uuid.uuid4(), "epoch": 1},
        code=RuntimeFailure.ARTIFACT_MISSING,
        retryable=False,
        detail=failure.detail,
    )
    assert report.detail == failure.detail
