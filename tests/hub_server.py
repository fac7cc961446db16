"""A real local HTTP server that speaks the Hugging Face Hub layout, for the artifact
tests: the revision and tree API the control plane resolves manifests from, and
`/{repo}/resolve/{commit}/{path}` with HTTP Range that agents download from.

Files above `lfs_threshold` bytes are LFS files (tree entries carry `lfs.oid`, the
content's SHA-256); smaller ones carry only their git blob id, as on the Hub.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import multiprocessing.process
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # noqa: S324


@dataclass
class Repo:
    # revision (branch, tag) -> commit
    revisions: dict[str, str] = field(default_factory=dict)
    # commit -> path -> content
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)


@dataclass
class HubState:
    repos: dict[str, Repo] = field(default_factory=dict)
    token: str | None = None
    lfs_threshold: int = 1024
    requests: list[str] = field(default_factory=list)
    # Range headers of file downloads, by path ("" when none was sent).
    ranges: list[tuple[str, str]] = field(default_factory=list)
    # Faults, by file path: send at most this many bytes per second...
    throttle: dict[str, float] = field(default_factory=dict)
    # ...or stop sending (and hold the connection) after this many bytes.
    stall_after: dict[str, int] = field(default_factory=dict)
    # Serve this content instead of the file's own (a source that changed underneath).
    corrupt: dict[str, bytes] = field(default_factory=dict)
    # Answer these bytes (as JSON) to a request for this API path: a hostile source.
    raw_answers: dict[str, bytes] = field(default_factory=dict)
    # Page the tree this many entries at a time (Link: rel="next", as the Hub does).
    tree_page: int | None = None
    # The tree's next-page link points here instead (a hostile source).
    tree_next: str | None = None
    # A file's download answers 302 to this Location (relative or absolute), as the
    # Hub sends LFS files to its CDN; a request with `signed=1` in its query is the
    # CDN's, served without the token, as a signed URL is.
    redirects: dict[str, str] = field(default_factory=dict)
    # (Host, Authorization or "") of every request, in order.
    authorizations: list[tuple[str, str]] = field(default_factory=list)
    released: threading.Event = field(default_factory=threading.Event)

    def add(self, repository: str, revision: str, commit: str, files: dict[str, bytes]) -> None:
        repo = self.repos.setdefault(repository, Repo())
        repo.revisions[revision] = commit
        repo.commits[commit] = dict(files)

    def tree(self, repository: str, commit: str) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = []
        directories: set[str] = set()
        for path, data in sorted(self.repos[repository].commits[commit].items()):
            parts = path.split("/")
            for depth in range(1, len(parts)):
                directories.add("/".join(parts[:depth]))
            entry: dict[str, Any] = {
                "type": "file",
                "path": path,
                "size": len(data),
                "oid": git_blob_id(data),
            }
            if len(data) > self.lfs_threshold:
                entry["lfs"] = {
                    "oid": hashlib.sha256(data).hexdigest(),
                    "size": len(data),
                    "pointerSize": 134,
                }
            entries.append(entry)
        entries += [{"type": "directory", "path": d, "oid": "0" * 40} for d in directories]
        return entries


_REVISION = re.compile(r"^/api/models/(.+)/revision/([^/]+)$")
_TREE = re.compile(r"^/api/models/(.+)/tree/([^/]+)$")
_RESOLVE = re.compile(r"^/(.+?)/resolve/([0-9a-f]{40})/(.+)$")


def _handler(state: HubState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, value: Any) -> None:
            self._send(status, json.dumps(value).encode(), {"Content-Type": "application/json"})

        def do_GET(self) -> None:
            path = unquote(urlsplit(self.path).path)
            signed = "signed=1" in urlsplit(self.path).query
            state.requests.append(path)
            state.authorizations.append(
                (self.headers.get("Host", ""), self.headers.get("Authorization", ""))
            )
            authorized = self.headers.get("Authorization") == f"Bearer {state.token}"
            if state.token and not signed and not authorized:
                self._json(401, {"error": "unauthorized"})
                return
            if path in state.raw_answers:
                body = state.raw_answers[path]
                self._send(200, body, {"Content-Type": "application/json"})
                return
            if found := _REVISION.match(path):
                repo = state.repos.get(found.group(1))
                commit = repo.revisions.get(found.group(2)) if repo else None
                if repo is not None and commit is None and found.group(2) in repo.commits:
                    commit = found.group(2)
                if commit is None:
                    self._json(404, {"error": "revision not found"})
                else:
                    self._json(200, {"id": found.group(1), "sha": commit})
                return
            if found := _TREE.match(path):
                repo = state.repos.get(found.group(1))
                if repo is None or found.group(2) not in repo.commits:
                    self._json(404, {"error": "not found"})
                else:
                    self._tree_page(path, state.tree(found.group(1), found.group(2)))
                return
            if found := _RESOLVE.match(path):
                self._resolve(found.group(1), found.group(2), found.group(3))
                return
            self._json(404, {"error": "no such route"})

        def _tree_page(self, path: str, entries: list[dict[str, Any]]) -> None:
            size = state.tree_page
            if size is None:
                self._json(200, entries)
                return
            query = parse_qs(urlsplit(self.path).query)
            start = int(query.get("cursor", ["0"])[0])
            page = entries[start : start + size]
            headers = {"Content-Type": "application/json"}
            if start + size < len(entries):
                origin = f"http://{self.headers.get('Host')}"
                following = f"{origin}{path}?recursive=true&cursor={start + size}"
                headers["Link"] = f'<{state.tree_next or following}>; rel="next"'
            self._send(200, json.dumps(page).encode(), headers)

        def _resolve(self, repository: str, commit: str, file_path: str) -> None:
            repo = state.repos.get(repository)
            data = repo.commits.get(commit, {}).get(file_path) if repo else None
            if data is None:
                self._json(404, {"error": "entry not found"})
                return
            data = state.corrupt.get(file_path, data)
            location = state.redirects.get(file_path)
            if location is not None and "signed=1" not in urlsplit(self.path).query:
                self._send(302, b"", {"Location": location})
                return
            state.ranges.append((file_path, self.headers.get("Range", "")))
            ranged = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
            start = int(ranged.group(1)) if ranged else 0
            if start >= len(data) and ranged:
                self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
                return
            if ranged:
                status = 206
                headers = {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"}
            else:
                status, headers = 200, {"Accept-Ranges": "bytes"}
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data) - start))
            self.end_headers()
            self._body(file_path, data, start)

        def _body(self, file_path: str, data: bytes, start: int) -> None:
            rate = state.throttle.get(file_path)
            stall = state.stall_after.get(file_path)
            # Small writes only where the pace matters; otherwise as fast as the socket.
            chunk = 16 * 1024 if rate or stall is not None else 1 << 20
            view = memoryview(data)
            sent = start
            try:
                while sent < len(data):
                    if stall is not None and sent >= stall:
                        state.released.wait()  # hold the connection, send nothing
                        return
                    end = min(len(data), sent + chunk)
                    if stall is not None:
                        end = min(end, max(stall, sent + 1))
                    self.wfile.write(view[sent:end])
                    self.wfile.flush()
                    if rate:
                        time.sleep((end - sent) / rate)
                    sent = end
            except (BrokenPipeError, ConnectionResetError):
                return

    return Handler


class HubServer:
    def __init__(self) -> None:
        self.state = HubState()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.state))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._stopped = False

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> HubServer:
        self._thread.start()
        return self

    def start_process(self) -> multiprocessing.process.BaseProcess:
        """Serve from a forked child instead (benchmarks: no GIL shared with the client
        being measured). The state is the child's copy from here on."""
        child = multiprocessing.get_context("fork").Process(
            target=self._server.serve_forever, daemon=True
        )
        child.start()
        self._stopped = True  # the child's to serve; stopping it is terminating it
        return child

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.state.released.set()
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def hub() -> Iterator[HubServer]:
    server = HubServer().start()
    yield server
    server.stop()
