"""Server-resolved manifests (api/manifests.py) against a real local server that speaks
the Hub layout (tests/hub_server.py): a revision and patterns become an exact commit and
each file's size and digest, LFS files by SHA-256 and small files by git blob id."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from api.errors import ServiceUnavailable
from api.manifests import ManifestResolver
from schemas.artifacts import ManifestRequest
from tests.admin_helpers import ok, refused
from tests.api_server import ApiFactory, RunningApi
from tests.artifact_flows import content, create_job, node_with_roots
from tests.hub_server import HubServer, git_blob_id

REPO = "acme/tiny-model"
COMMIT = "fedcba9876543210fedcba9876543210fedcba98"
FILES = {
    "config.json": content("config.json", 200),
    "model-q4.gguf": content("model-q4.gguf", 5000),
    "model-q8.gguf": content("model-q8.gguf", 9000),
    "docs/README.md": content("readme", 100),
}


def _api(api_factory: ApiFactory, hub: HubServer, **overrides: object) -> RunningApi:
    return api_factory(artifact_source_url=hub.url, **overrides)


def test_a_revision_and_patterns_resolve_to_exact_files(
    api_factory: ApiFactory, hub: HubServer
) -> None:
    hub.state.add(REPO, "main", COMMIT, FILES)
    api = _api(api_factory, hub)
    with api.client() as client:
        node = node_with_roots(client, api)
        resolve = {"repository": REPO, "revision": "main", "patterns": ["*q4.gguf", "*.json"]}
        job = ok(create_job(client, api, node, manifest=None, resolve=resolve), 201)
    assert job["spec"]["commit"] == COMMIT
    assert job["spec"]["files"] == [
        {
            "path": "config.json",
            "size": 200,
            "digest": {"algorithm": "git-sha1", "value": git_blob_id(FILES["config.json"])},
        },
        {
            "path": "model-q4.gguf",
            "size": 5000,
            "digest": {
                "algorithm": "sha256",
                "value": hashlib.sha256(FILES["model-q4.gguf"]).hexdigest(),
            },
        },
    ]


def test_what_the_source_cannot_resolve_is_the_operators_422(
    api_factory: ApiFactory, hub: HubServer
) -> None:
    hub.state.add(REPO, "main", COMMIT, FILES)
    api = _api(api_factory, hub)
    with api.client() as client:
        node = node_with_roots(client, api)

        def attempt(**resolve: object) -> dict[str, object]:
            body = {"repository": REPO, "revision": "main", "patterns": ["*.gguf"]} | resolve
            return refused(
                create_job(client, api, node, manifest=None, resolve=body),
                422,
                "manifest_unresolved",
            )

        attempt(revision="no-such-branch")
        attempt(repository="acme/no-such-model")
        attempt(patterns=["*.safetensors"])


def test_a_token_is_sent_and_a_refusal_is_reported(api_factory: ApiFactory, hub: HubServer) -> None:
    hub.state.add(REPO, "main", COMMIT, FILES)
    hub.state.token = "hub-secret-token"
    resolve = {"repository": REPO, "revision": "main", "patterns": ["*.gguf"]}
    without = _api(api_factory, hub)
    with without.client() as client:
        node = node_with_roots(client, without)
        refused(
            create_job(client, without, node, manifest=None, resolve=resolve),
            422,
            "manifest_unresolved",
        )
    with_token = _api(api_factory, hub, artifact_source_token="hub-secret-token")
    with with_token.client() as client:
        job = ok(create_job(client, with_token, node, manifest=None, resolve=resolve), 201)
        assert [f["path"] for f in job["spec"]["files"]] == ["model-q4.gguf", "model-q8.gguf"]


def test_an_unreachable_source_is_503(api_factory: ApiFactory, hub: HubServer) -> None:
    url = hub.url
    hub.stop()
    api = api_factory(artifact_source_url=url)
    with api.client() as client:
        node = node_with_roots(client, api)
        resolve = {"repository": REPO, "patterns": ["*.gguf"]}
        error = refused(
            create_job(client, api, node, manifest=None, resolve=resolve), 503, "source_unavailable"
        )
    # What to do about it: which source, and the setting that chose it (offline, a mirror).
    assert error["message"].startswith(f"the artifact source {url} (a mirror) cannot be reached")
    assert "MODELFORGE_ARTIFACT_SOURCE_URL" in error["message"], error


ODD_BUT_SAFE = {
    "my model (1).gguf": content("parens", 3000),
    "ünïcödé~/weights v2.gguf": content("unicode", 2000),
    "日本語.json": content("cjk", 50),
    "~backup.json": content("tilde", 60),
}


def test_every_safe_name_the_hub_accepts_is_kept(api_factory: ApiFactory, hub: HubServer) -> None:
    """Spaces, non-ASCII letters, `~`, parentheses: part of the manifest, never dropped."""
    hub.state.add(REPO, "main", COMMIT, FILES | ODD_BUT_SAFE)
    api = _api(api_factory, hub)
    with api.client() as client:
        node = node_with_roots(client, api)
        resolve = {"repository": REPO, "patterns": ["*.gguf", "*.json", "my model (*"]}
        job = ok(create_job(client, api, node, manifest=None, resolve=resolve), 201)
    paths = [f["path"] for f in job["spec"]["files"]]
    assert paths == sorted(
        ["config.json", "model-q4.gguf", "model-q8.gguf", *ODD_BUT_SAFE], key=str
    ), paths


def test_a_selected_file_the_job_cannot_hold_refuses_the_create_by_name(
    api_factory: ApiFactory, hub: HubServer
) -> None:
    unsafe = {
        "back\\slash.gguf": content("backslash", 10),
        "bell\x07.gguf": content("control", 10),
        "evil\u202egguf.exe.gguf": content("bidi", 10),
        # 265 bytes in UTF-8: more than a filesystem name holds.
        "é" * 130 + ".gguf": content("long", 10),
    }
    hub.state.add(REPO, "main", COMMIT, FILES | unsafe)
    api = _api(api_factory, hub)
    with api.client() as client:
        node = node_with_roots(client, api)
        resolve = {"repository": REPO, "patterns": ["*.gguf"]}
        answer = create_job(client, api, node, manifest=None, resolve=resolve)
        body = refused(answer, 422, "manifest_unresolved")
        assert body["extra"]["files"] == sorted(unsafe), body
        assert "4 selected file(s)" in body["message"]
        # Patterns that leave them out resolve as before.
        resolve["patterns"] = ["model-*.gguf"]
        ok(create_job(client, api, node, manifest=None, resolve=resolve), 201)


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nests deeper"),
        (b'{"sha": "' + b"f" * (17 << 20) + b'"}', "larger than"),
        (b"<html>rate limited</html>", "not JSON"),
        (b'{"commit": "fedcba9876543210fedcba9876543210fedcba98"}', "sha"),
    ],
    ids=["deep", "oversized", "not-json", "wrong-shape"],
)
def test_a_hostile_revision_answer_is_a_typed_502(
    api_factory: ApiFactory, hub: HubServer, answer: bytes, reason: str
) -> None:
    hub.state.add(REPO, "main", COMMIT, FILES)
    hub.state.raw_answers[f"/api/models/{REPO}/revision/main"] = answer
    api = _api(api_factory, hub)
    with api.client() as client:
        node = node_with_roots(client, api)
        resolve = {"repository": REPO, "patterns": ["*.gguf"]}
        body = refused(
            create_job(client, api, node, manifest=None, resolve=resolve), 502, "source_invalid"
        )
    assert reason in body["message"]


def test_a_hostile_tree_answer_is_a_typed_502(api_factory: ApiFactory, hub: HubServer) -> None:
    hub.state.add(REPO, "main", COMMIT, FILES)
    tree = f"/api/models/{REPO}/tree/{COMMIT}"
    api = _api(api_factory, hub)
    with api.client() as client:
        node = node_with_roots(client, api)
        resolve = {"repository": REPO, "patterns": ["*.gguf"]}
        for answer, reason in [
            (b'[{"type": "file", "path": "a", "lfs": ' * 5000 + b"1" + b"}]" * 5000, "nests"),
            (b'{"not": "a list"}', "tree"),
            (b'[{"type": "file", "path": ["a"]}]', "0.path"),
        ]:
            hub.state.raw_answers[tree] = answer
            body = refused(
                create_job(client, api, node, manifest=None, resolve=resolve),
                502,
                "source_invalid",
            )
            assert reason in body["message"], body
        # The API is still well: the source answers properly again, the job is created.
        del hub.state.raw_answers[tree]
        ok(create_job(client, api, node, manifest=None, resolve=resolve), 201)


def test_every_page_of_a_paginated_tree_is_read(api_factory: ApiFactory, hub: HubServer) -> None:
    """The Hub pages long trees (Link: rel="next"): a file on a later page is resolved,
    never left out."""
    hub.state.add(REPO, "main", COMMIT, FILES)
    hub.state.tree_page = 2
    api = _api(api_factory, hub)
    with api.client() as client:
        node = node_with_roots(client, api)
        resolve = {"repository": REPO, "revision": "main", "patterns": ["*"]}
        job = ok(create_job(client, api, node, manifest=None, resolve=resolve), 201)
    assert [f["path"] for f in job["spec"]["files"]] == sorted(FILES)
    tree_requests = [r for r in hub.state.requests if "/tree/" in r]
    assert len(tree_requests) >= 3, tree_requests


def test_a_next_page_outside_the_source_is_a_typed_502(
    api_factory: ApiFactory, hub: HubServer
) -> None:
    """The token goes with every request: a link to another host is never followed."""
    hub.state.add(REPO, "main", COMMIT, FILES)
    hub.state.tree_page = 2
    hub.state.tree_next = "http://elsewhere.invalid/api/models/x/tree/y?cursor=2"
    api = _api(api_factory, hub)
    with api.client() as client:
        node = node_with_roots(client, api)
        resolve = {"repository": REPO, "revision": "main", "patterns": ["*"]}
        body = refused(create_job(client, api, node, manifest=None, resolve=resolve), 502,
                       "source_invalid")  # fmt: skip
    assert "links outside the source" in body["message"]


class _TricklingSource:
    """A source that answers 200 and then one byte of its revision answer every 0.1 s:
    each read well inside httpx's per-operation timeout, the whole far past any."""

    def __init__(self) -> None:
        stopping = self.stopping = threading.Event()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = b'{"sha": "' + b"0" * 40 + b'"}' + b" " * 400
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                for byte in body:
                    if stopping.wait(0.1):
                        return
                    try:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                    except OSError:
                        return

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        host, port = self.server.server_address[:2]
        self.url = f"http://{host!s}:{port}"

    def stop(self) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()


async def test_a_source_trickling_its_answer_is_given_up_as_a_whole() -> None:
    """httpx's timeout bounds each socket read, not an answer: a source that sends a byte
    within it each time held a create for as long as it liked (review R1). Each answer
    now has a total time limit, past which the source counts as unavailable (503)."""
    source = _TricklingSource()
    resolver = ManifestResolver(source.url, None, timeout_s=1.0, answer_timeout_s=1.0)
    started = time.monotonic()
    try:
        with pytest.raises(ServiceUnavailable):
            await asyncio.wait_for(
                resolver.resolve(ManifestRequest(repository=REPO, patterns=["*.gguf"])), 10.0
            )
    finally:
        await resolver.close()
        source.stop()
    assert time.monotonic() - started < 3.0
