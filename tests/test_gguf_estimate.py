"""The GGUF header's summary and the memory estimate (store/services/estimate.py), and the
header fetched from a Hub-layout source by Range (api/model_headers.py).

Files are written by llama.cpp's own writer (gguf.GGUFWriter) and read back by its own
reader (gguf.GGUFReader) to check what the prefix parser computes; hostile headers are
built byte by byte."""

from __future__ import annotations

import dataclasses
import gzip
import os
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from api.model_headers import FIRST_BYTES, ModelHeaders
from schemas.base import SAFE_INT_MAX
from schemas.runtime import LlamaSettings
from store.services.estimate import (
    COMPUTE_FLOOR,
    GiB,
    HeaderTruncated,
    HeaderUnreadable,
    estimate,
    parse_header,
    refine,
)
from tests.hub_server import HubServer

fast = pytest.mark.fast
REPO = "acme/tiny"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def write_gguf(path: Path, *, tokens: int = 100, context: int = 2048) -> bytes:
    """A tiny llama-architecture file: F32, F16, Q8_0 and Q4_0 tensors."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_context_length(context)
    writer.add_token_list([f"token-{i}" for i in range(tokens)])
    writer.add_tensor("f32", np.ones((4, 32), dtype=np.float32))
    writer.add_tensor("f16", np.ones((8, 32), dtype=np.float16))
    for name, kind in (
        ("q8", gguf.GGMLQuantizationType.Q8_0),
        ("q4", gguf.GGMLQuantizationType.Q4_0),
    ):
        data = gguf.quants.quantize(np.ones((4, 64), dtype=np.float32), kind)
        writer.add_tensor(name, data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


@fast
def test_the_summary_matches_llama_cpp_s_own_reader(tmp_path: Path) -> None:
    data = write_gguf(tmp_path / "m.gguf")
    reader = gguf.GGUFReader(str(tmp_path / "m.gguf"))

    summary = parse_header(data)

    assert summary.architecture == "llama"
    assert (summary.block_count, summary.embedding_length) == (2, 64)
    assert (summary.head_count, summary.head_count_kv, summary.context_length) == (4, 2, 2048)
    assert summary.vocab_size == 100
    assert summary.tensor_count == len(reader.tensors) == 4
    assert summary.tensor_bytes == sum(int(t.n_bytes) for t in reader.tensors)
    # The header ends where the tensor data starts, but for the alignment's padding.
    assert summary.header_bytes <= reader.data_offset < summary.header_bytes + 32
    # The prefix is all it needs; one byte less is truncated, and says so.
    assert parse_header(data[: summary.header_bytes]) == summary
    with pytest.raises(HeaderTruncated):
        parse_header(data[: summary.header_bytes - 1])
    with pytest.raises(HeaderTruncated):
        parse_header(data[:100])


@fast
def test_the_kv_cache_is_the_total_context_shared_by_the_slots(tmp_path: Path) -> None:
    summary = parse_header(write_gguf(tmp_path / "m.gguf"))
    # 2 layers, 2 KV heads of 64 / 4 = 16 dims, keys and values, f16: 2 bytes.
    per_token = 2 * 2 * (16 + 16) * 2

    one = estimate(summary, 10_000, LlamaSettings(ctx_size=1024))
    assert one.kv_cache_bytes == 1024 * per_token
    assert one.weights_bytes == summary.tensor_bytes
    assert one.total_bytes == one.weights_bytes + one.kv_cache_bytes + one.compute_bytes
    assert one.compute_bytes >= COMPUTE_FLOOR
    # `--parallel` unset: llama-server's "auto", 4 slots.
    assert (one.source, one.context_size, one.parallel) == ("gguf_header", 1024, 4)

    # llama-server divides one cache among its slots: 8 slots need no more.
    eight = estimate(summary, 10_000, LlamaSettings(ctx_size=1024, server_args={"parallel": 8}))
    assert eight.kv_cache_bytes == one.kv_cache_bytes
    assert eight.parallel == 8

    # A quantized cache: q8_0 is 34 bytes per 32 elements.
    q8 = estimate(
        summary,
        10_000,
        LlamaSettings(ctx_size=1024, server_args={"cache-type-k": "q8_0", "cache-type-v": "q8_0"}),
    )
    assert q8.kv_cache_bytes == int(1024 * 2 * 2 * (16 + 16) * 34 / 32)

    # No ctx_size, or 0: the trained context, as our llama-server allocates it.
    assert estimate(summary, 10_000, LlamaSettings()).context_size == 2048
    assert estimate(summary, 10_000, LlamaSettings(ctx_size=0)).context_size == 2048
    # Flash attention turned off adds the KQ scores to the compute buffers (its default,
    # "auto", is on).
    off = estimate(summary, 10_000, LlamaSettings(ctx_size=1024, flash_attn=False))
    assert off.compute_bytes == one.compute_bytes + 512 * 1024 * 4 * 4


@fast
def test_without_a_header_the_file_size_and_a_floor_and_evidence_wins() -> None:
    blind = estimate(None, 3 * GiB, LlamaSettings())
    assert blind.source == "file_size"
    assert blind.weights_bytes == 3 * GiB
    assert blind.total_bytes == 3 * GiB + 1 * GiB
    assert "could not be read" in blind.detail

    measured = refine(blind, 2 * GiB)
    assert (measured.source, measured.total_bytes) == ("evidence", 2 * GiB)
    assert measured.weights_bytes == blind.weights_bytes
    assert refine(blind, None) == blind


def _header(*, tensors: int = 0, kvs: int = 1) -> bytes:
    return struct.pack("<IIQQ", gguf.GGUF_MAGIC, 3, tensors, kvs)


def _key(name: str) -> bytes:
    raw = name.encode()
    return struct.pack("<Q", len(raw)) + raw


@fast
@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"GGML" + bytes(20), id="bad magic"),
        pytest.param(struct.pack("<IIQQ", gguf.GGUF_MAGIC, 1, 0, 0), id="version 1"),
        pytest.param(struct.pack("<IIQQ", gguf.GGUF_MAGIC, 3, 0, 10**12), id="a trillion keys"),
        pytest.param(struct.pack("<IIQQ", gguf.GGUF_MAGIC, 3, 10**12, 0), id="a trillion tensors"),
        pytest.param(_header() + _key("k") + struct.pack("<IIQ", 9, 8, 2**60), id="2^60 strings"),
        pytest.param(_header() + _key("k") + struct.pack("<IIQ", 9, 4, 2**60), id="2^60 integers"),
        pytest.param(_header() + struct.pack("<Q", 2**62), id="a 2^62-byte key"),
        pytest.param(_header() + _key("k") + struct.pack("<IQ", 8, 2**40), id="a 1 TiB string"),
        pytest.param(_header() + _key("k") + struct.pack("<I", 99), id="an unknown type"),
        pytest.param(_header() + _key("k") + struct.pack("<IIQ", 9, 9, 1), id="an array of arrays"),
        pytest.param(
            _header(tensors=1, kvs=0) + _key("t") + struct.pack("<I", 9) + bytes(100),
            id="9 dimensions",
        ),
        pytest.param(
            _header(tensors=1, kvs=0) + _key("t") + struct.pack("<IQIQ", 1, 4, 9999, 0),
            id="an unknown tensor type",
        ),
    ],
)
def test_a_hostile_header_is_refused_at_once(data: bytes) -> None:
    started = time.monotonic()
    with pytest.raises(HeaderUnreadable):
        parse_header(data + bytes(64))
    assert time.monotonic() - started < 0.1


@fast
def test_a_big_tokenizer_is_skipped_not_kept(tmp_path: Path) -> None:
    """200,000 tokens: the array's length is read, its strings are walked over."""
    data = write_gguf(tmp_path / "m.gguf", tokens=200_000)
    started = time.monotonic()
    summary = parse_header(data)
    assert time.monotonic() - started < 2.0
    assert summary.vocab_size == 200_000
    assert summary.header_bytes > FIRST_BYTES  # what the reader's second read is for


SMOLLM = "SmolLM2-135M-Instruct.Q4_1.gguf"


@fast
def test_the_real_smollm2_header_when_the_cache_holds_it() -> None:
    """The test model (ops/llama/build.py --model), when present: never fetched here."""
    cache = os.environ.get("MODELFORGE_CACHE_DIR") or str(Path.home() / ".cache" / "modelforge")
    path = Path(cache) / "models" / SMOLLM
    if not path.is_file():
        pytest.skip(f"{path} is not cached (ops/llama/build.py --model fetches it)")
    size = path.stat().st_size
    with path.open("rb") as file:
        prefix = file.read(8 * 1024 * 1024)
    summary = parse_header(prefix)
    assert summary.architecture == "llama"
    assert summary.block_count == 30
    assert summary.head_count_kv == 3
    # The weights are the file but for its header and padding.
    assert size - 64 * 1024 * 1024 < summary.tensor_bytes <= size - summary.header_bytes
    # The figures our llama-server printed for it at --ctx-size 2048: "KV size = 45.00
    # MiB", a 15.5 MiB compute buffer (the estimate errs above it, by its floor).
    need = estimate(summary, size, LlamaSettings(ctx_size=2048))
    assert need.kv_cache_bytes == 45 * 1024 * 1024
    assert 15.5 * 1024 * 1024 < need.compute_bytes < 100 * 1024 * 1024


# ------------------------------------------------------------------ api/model_headers.py


async def test_the_header_is_fetched_by_prefix_and_grown_once(
    hub: HubServer, tmp_path: Path
) -> None:
    small = write_gguf(tmp_path / "small.gguf")
    big = write_gguf(tmp_path / "big.gguf", tokens=200_000)
    hub.state.add(REPO, "main", COMMIT, {"small.gguf": small, "big.gguf": big, "x.txt": b"no"})
    headers = ModelHeaders(hub.url, None, 10.0, 32 * 1024 * 1024)
    try:
        summary = await headers.summary(REPO, COMMIT, "small.gguf")
        assert summary == parse_header(small)
        grown = await headers.summary(REPO, COMMIT, "big.gguf")
        assert grown == parse_header(big)
        # Two reads for the big one, each a Range, the second from where the first ended.
        asked = [r for path, r in hub.state.ranges if path == "big.gguf"]
        assert asked == [
            f"bytes=0-{FIRST_BYTES - 1}",
            f"bytes={FIRST_BYTES}-{32 * 1024 * 1024 - 1}",
        ]

        assert await headers.summary(REPO, COMMIT, "x.txt") is None
        assert await headers.summary(REPO, COMMIT, "absent.gguf") is None
    finally:
        await headers.close()


async def test_a_header_past_the_bound_or_an_unreachable_source_gives_none(
    hub: HubServer, tmp_path: Path
) -> None:
    big = write_gguf(tmp_path / "big.gguf", tokens=200_000)
    hub.state.add(REPO, "main", COMMIT, {"big.gguf": big})
    bounded = ModelHeaders(hub.url, None, 10.0, 256 * 1024)
    unreachable = ModelHeaders("http://127.0.0.1:9", None, 2.0, 1024 * 1024)
    try:
        assert await bounded.summary(REPO, COMMIT, "big.gguf") is None
        assert await unreachable.summary(REPO, COMMIT, "big.gguf") is None
    finally:
        await bounded.close()
        await unreachable.close()


async def test_redirects_are_followed_and_the_token_stays_home(
    hub: HubServer, tmp_path: Path
) -> None:
    """The Hub sends LFS files to its CDN: the redirect is followed (a signed URL needs
    no token); the token goes to the endpoint's own origin only."""
    small = write_gguf(tmp_path / "small.gguf")
    hub.state.token = "secret-token"
    hub.state.add(REPO, "main", COMMIT, {"small.gguf": small})
    cdn = hub.url.replace("127.0.0.1", "localhost")
    hub.state.redirects["small.gguf"] = f"{cdn}/{REPO}/resolve/{COMMIT}/small.gguf?signed=1"
    headers = ModelHeaders(hub.url, "secret-token", 10.0, 1024 * 1024)
    try:
        assert await headers.summary(REPO, COMMIT, "small.gguf") == parse_header(small)
    finally:
        await headers.close()
    sent = dict(hub.state.authorizations)
    assert sent[hub.url.removeprefix("http://")] == "Bearer secret-token"
    assert sent[cdn.removeprefix("http://")] == ""


@fast
@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"block_count": -5}, id="negative layers"),
        pytest.param({"context_length": 2**63}, id="a 2^63-token context"),
        pytest.param({"architecture": "a" * 256}, id="a long architecture"),
        pytest.param({"tensor_bytes": 2**300}, id="tensors past any device"),
        pytest.param({"embedding_length": 1 << 40, "head_count": 1}, id="a 2^40 width"),
    ],
)
def test_a_header_no_model_has_is_estimated_from_the_file_size(
    tmp_path: Path, changes: dict[str, Any]
) -> None:
    """The header comes from an untrusted source: values no model has give the file's
    size, as a header that cannot be read does, never an error."""
    summary = dataclasses.replace(parse_header(write_gguf(tmp_path / "m.gguf")), **changes)
    need = estimate(summary, 5 * GiB, LlamaSettings(ctx_size=0))
    assert (need.source, need.weights_bytes) == ("file_size", 5 * GiB)
    assert "unusable" in need.detail or "wire" in need.detail


@fast
def test_a_file_size_near_the_wire_bound_is_clamped_not_raised() -> None:
    """A source may claim a file of up to 2^53 - 1 bytes: the file-size estimate adds
    a quarter for the KV cache and compute, which would pass what the wire carries. The
    estimate clamps every figure to the bound instead of raising (review R1)."""
    for size in (SAFE_INT_MAX, SAFE_INT_MAX - 1, SAFE_INT_MAX // 10 * 9):
        figure = estimate(None, size, LlamaSettings())
        assert figure.total_bytes == SAFE_INT_MAX
        assert figure.weights_bytes <= SAFE_INT_MAX
        assert figure.source == "file_size"
    below = estimate(None, 8 * GiB, LlamaSettings())
    assert below.total_bytes == 10 * GiB


class _GzipSource:
    """A source that answers every GET with a gzip-encoded file whatever the client
    accepts (a decompression bomb's shape), and records the Accept-Encoding it got."""

    def __init__(self, body: bytes) -> None:
        self.accepted: list[str | None] = []
        encoded = gzip.compress(body)
        accepted = self.accepted

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                accepted.append(self.headers.get("Accept-Encoding"))
                self.send_response(200)
                self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Length", str(len(encoded)))
                self.end_headers()
                self.wfile.write(encoded)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        host, port = self.server.server_address[:2]
        self.url = f"http://{host!s}:{port}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def test_the_header_is_asked_for_unencoded_and_an_encoded_answer_is_refused(
    tmp_path: Path,
) -> None:
    """A compressed answer could decompress to many times the bytes read (each chunk up
    to tens of MiB): the header is asked for as `identity`, and an answer encoded anyway
    is refused (no estimate from it) rather than decoded (review R1)."""
    source = _GzipSource(write_gguf(tmp_path / "small.gguf"))
    headers = ModelHeaders(source.url, None, 10.0, 1024 * 1024)
    try:
        assert await headers.summary(REPO, COMMIT, "small.gguf") is None
    finally:
        await headers.close()
        source.stop()
    assert source.accepted == ["identity"]
