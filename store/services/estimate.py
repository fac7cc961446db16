"""What one replica needs on its device, from the GGUF header (issue 32's Fit).

`parse_header` reads a GGUF file's header from a prefix of the file (the magic, the
version, the key/value metadata and the tensor infos), never its tensor data: the
control plane fetches only that prefix from the source (api/model_headers.py). The
`gguf` package (llama.cpp's own) gives the constants: value types, quantization block
sizes, key names. Its GGUFReader needs the whole file (it memory-maps it), so the walk
over the prefix is here, bounded: a hostile header costs bounded memory and time
(string lengths, array counts, tensor counts and dimensions are all capped, and every
count is checked against the bytes left before anything is allocated).

`estimate` turns a summary and a runtime profile's settings into a MemoryEstimate
(weights + KV cache + compute buffers); `refine` prefers a figure measured on a node.
Pure code: no I/O.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Final

import gguf

from schemas.base import SAFE_INT_MAX
from schemas.runtime import LlamaSettings
from schemas.services import MemoryEstimate

GiB: Final = 1 << 30
MiB: Final = 1 << 20

# Bounds on a header (a real one is far inside them: tens of KV pairs, a tokenizer of a
# few hundred thousand strings, a few thousand tensors of at most 4 dimensions).
MAX_KV_COUNT: Final = 100_000
MAX_TENSOR_COUNT: Final = 1_000_000
MAX_ARRAY_COUNT: Final = 16_000_000
MAX_STRING_BYTES: Final = 16 * MiB
MAX_DIMS: Final = 4  # GGML_MAX_DIMS
# Integer arrays this short are read (a per-layer head count); longer ones are skipped.
MAX_KEPT_ARRAY: Final = 4096
# Strings kept in the summary's metadata (the architecture name); longer ones skipped.
MAX_KEPT_STRING: Final = 256

_SCALARS: Final[dict[gguf.GGUFValueType, str]] = {
    gguf.GGUFValueType.UINT8: "<B",
    gguf.GGUFValueType.INT8: "<b",
    gguf.GGUFValueType.UINT16: "<H",
    gguf.GGUFValueType.INT16: "<h",
    gguf.GGUFValueType.UINT32: "<I",
    gguf.GGUFValueType.INT32: "<i",
    gguf.GGUFValueType.FLOAT32: "<f",
    gguf.GGUFValueType.BOOL: "<?",
    gguf.GGUFValueType.UINT64: "<Q",
    gguf.GGUFValueType.INT64: "<q",
    gguf.GGUFValueType.FLOAT64: "<d",
}


class HeaderUnreadable(ValueError):
    """Not a GGUF header we can read: bad magic or version, an unknown type, a value
    past a bound."""


class HeaderTruncated(HeaderUnreadable):
    """The prefix ends inside the header: `needed` is a lower bound on the prefix length
    that could hold it (a reader fetches more and tries again)."""

    def __init__(self, needed: int) -> None:
        super().__init__(f"the GGUF header continues past the bytes read (needs > {needed})")
        self.needed = needed


@dataclass(frozen=True)
class GgufSummary:
    architecture: str | None
    block_count: int | None
    embedding_length: int | None
    head_count: int | None
    head_count_kv: int | None
    key_length: int | None
    value_length: int | None
    context_length: int | None
    # The tokenizer's token count (the array's length; the strings are skipped).
    vocab_size: int | None
    # Sum over tensors of their data size, from their dims and type's block size.
    tensor_bytes: int
    tensor_count: int
    # Bytes from the file's start to the end of the tensor infos: what a reader needed.
    header_bytes: int
    version: int


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.at = 0

    def need(self, count: int) -> None:
        if count < 0 or self.at + count > len(self.data):
            raise HeaderTruncated(self.at + max(count, 0))

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        self.need(size)
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += size
        return value

    def u32(self) -> int:
        return int(self.unpack("<I"))

    def u64(self) -> int:
        return int(self.unpack("<Q"))

    def string(self, keep: int) -> str | None:
        """A string; its text only when at most `keep` bytes (else None, skipped)."""
        length = self.u64()
        if length > MAX_STRING_BYTES:
            raise HeaderUnreadable(f"a string of {length} bytes is past the bound")
        self.need(length)
        start, self.at = self.at, self.at + length
        if length > keep:
            return None
        return bytes(self.data[start : self.at]).decode("utf-8", errors="replace")

    def skip_strings(self, count: int) -> None:
        # Each string is at least its 8-byte length: refuse a count the prefix cannot
        # hold before walking it (a hostile count costs nothing).
        self.need(count * 8)
        for _ in range(count):
            length = self.u64()
            if length > MAX_STRING_BYTES:
                raise HeaderUnreadable(f"a string of {length} bytes is past the bound")
            self.need(length)
            self.at += length


def _value_type(raw: int) -> gguf.GGUFValueType:
    try:
        return gguf.GGUFValueType(raw)
    except ValueError:
        raise HeaderUnreadable(f"unknown GGUF value type {raw}") from None


def _value(cursor: _Cursor, kind: gguf.GGUFValueType) -> Any:
    """A metadata value: scalars and short strings as values, a short integer array as
    a list, anything else skipped (None); arrays are never nested more than once."""
    if kind == gguf.GGUFValueType.STRING:
        return cursor.string(MAX_KEPT_STRING)
    if kind != gguf.GGUFValueType.ARRAY:
        return cursor.unpack(_SCALARS[kind])
    item = _value_type(cursor.u32())
    count = cursor.u64()
    if count > MAX_ARRAY_COUNT:
        raise HeaderUnreadable(f"an array of {count} items is past the bound")
    if item == gguf.GGUFValueType.STRING:
        cursor.skip_strings(count)
        return _Skipped(count)
    if item == gguf.GGUFValueType.ARRAY:
        raise HeaderUnreadable("nested metadata arrays are not read")
    fmt = _SCALARS[item]
    size = struct.calcsize(fmt) * count
    cursor.need(size)
    if count > MAX_KEPT_ARRAY:
        cursor.at += size
        return _Skipped(count)
    values = list(struct.unpack_from("<" + fmt[1:] * count, cursor.data, cursor.at))
    cursor.at += size
    return values


@dataclass(frozen=True)
class _Skipped:
    """An array not materialised: only its length."""

    count: int


def parse_header(data: bytes) -> GgufSummary:
    """The summary of the GGUF header at the start of `data` (a prefix of the file).
    HeaderTruncated when the prefix ends inside the header, HeaderUnreadable otherwise."""
    cursor = _Cursor(data)
    magic = cursor.u32()
    if magic != gguf.GGUF_MAGIC:
        raise HeaderUnreadable("not a GGUF file (bad magic)")
    version = cursor.u32()
    if version not in (2, 3):
        raise HeaderUnreadable(f"GGUF version {version} is not read (2 and 3 are)")
    tensor_count = cursor.u64()
    kv_count = cursor.u64()
    if tensor_count > MAX_TENSOR_COUNT or kv_count > MAX_KV_COUNT:
        raise HeaderUnreadable(f"{tensor_count} tensors, {kv_count} keys: past the bounds")
    metadata: dict[str, Any] = {}
    for _ in range(kv_count):
        key = cursor.string(MAX_STRING_BYTES)
        kind = _value_type(cursor.u32())
        value = _value(cursor, kind)
        if key is not None:
            metadata[key] = value
    # A tensor info is at least a name's length, n_dims, one dim, type and offset.
    cursor.need(tensor_count * 28)
    tensor_bytes = 0
    for _ in range(tensor_count):
        cursor.string(0)
        n_dims = cursor.u32()
        if n_dims > MAX_DIMS:
            raise HeaderUnreadable(f"a tensor of {n_dims} dimensions")
        elements = 1
        for _ in range(n_dims):
            elements *= cursor.u64()
        raw_type = cursor.u32()
        cursor.u64()  # the offset in the data section
        try:
            block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(raw_type)]
        except (ValueError, KeyError):
            raise HeaderUnreadable(f"unknown tensor type {raw_type}") from None
        tensor_bytes += elements // block * type_size
    return _summary(metadata, tensor_bytes, int(tensor_count), cursor.at, version)


def _integer(value: Any) -> int | None:
    """An integer key's value; a per-layer list's largest (the layer that needs most)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return int(max(value))
    return None


def _summary(
    metadata: dict[str, Any], tensor_bytes: int, tensor_count: int, size: int, version: int
) -> GgufSummary:
    arch = metadata.get(gguf.Keys.General.ARCHITECTURE)
    arch = arch if isinstance(arch, str) else None

    def arch_key(template: str) -> int | None:
        return _integer(metadata.get(template.format(arch=arch))) if arch else None

    tokens = metadata.get(gguf.Keys.Tokenizer.LIST)
    vocab = tokens.count if isinstance(tokens, _Skipped) else None
    return GgufSummary(
        architecture=arch,
        block_count=arch_key(gguf.Keys.LLM.BLOCK_COUNT),
        embedding_length=arch_key(gguf.Keys.LLM.EMBEDDING_LENGTH),
        head_count=arch_key(gguf.Keys.Attention.HEAD_COUNT),
        head_count_kv=arch_key(gguf.Keys.Attention.HEAD_COUNT_KV),
        key_length=arch_key(gguf.Keys.Attention.KEY_LENGTH),
        value_length=arch_key(gguf.Keys.Attention.VALUE_LENGTH),
        context_length=arch_key(gguf.Keys.LLM.CONTEXT_LENGTH),
        vocab_size=vocab or arch_key(gguf.Keys.LLM.VOCAB_SIZE),
        tensor_bytes=tensor_bytes,
        tensor_count=tensor_count,
        header_bytes=size,
        version=version,
    )


# ------------------------------------------------------------------ the estimate

# Checked against the llama-server we build (ops/llama/build.py; SmolLM2-135M, CPU):
# with no `--ctx-size` it allocates the model's trained context (8192 cells) for
# n_parallel "auto" = 4 slots sharing one unified cache; `--ctx-size 2048` gave "KV
# size = 45.00 MiB (2048 cells, 30 layers)", this module's formula to the byte, and a
# 15.5 MiB compute buffer (flash attention "auto": on).
#
# The context when the header does not say the trained one.
DEFAULT_CONTEXT: Final = 4096
DEFAULT_UBATCH: Final = 512
# llama-server's `--parallel` unset (or -1): "auto", 4 slots.
DEFAULT_PARALLEL: Final = 4
# Compute buffers: a fixed floor (the graph's own allocations, a backend's scratch)...
COMPUTE_FLOOR: Final = 64 * MiB
# ...plus, per token of a micro-batch, a few f32 activations of the embedding width
# (ACTIVATION_FACTOR of them alive at once: the attention's and the feed-forward's),
# the logits of one output per slot (f32 per vocabulary entry), and only with flash
# attention turned off (llama.cpp's default is "auto", on where the backend has it) the
# KQ scores (f32, a head's row per context position).
ACTIVATION_FACTOR: Final = 8
# The header could not be read: the KV cache and compute buffers are guessed as a
# quarter of the file, at least this much (a 4096-token f16 cache of a 7B model is 2 GiB).
UNKNOWN_OVERHEAD_FLOOR: Final = 1 * GiB


def _cache_bytes_per_element(name: Any) -> float:
    """Bytes per element of a KV cache type (`cache-type-k`/`-v`, f16 by default)."""
    try:
        quant = gguf.GGMLQuantizationType[str(name).upper()] if name else None
    except KeyError:
        quant = None
    block, size = gguf.GGML_QUANT_SIZES[quant or gguf.GGMLQuantizationType.F16]
    return size / block


def _context(summary: GgufSummary, settings: LlamaSettings) -> int:
    """The total context llama-server allocates: the profile's ctx_size; unset or 0, the
    model's trained length (what our llama-server does: a model trained on 128k tokens
    gets a 128k cache unless the profile says less), DEFAULT_CONTEXT when unknown."""
    if settings.ctx_size is not None and settings.ctx_size > 0:
        return settings.ctx_size
    return summary.context_length or DEFAULT_CONTEXT


def _parallel(settings: LlamaSettings) -> int:
    value = settings.server_args.get("parallel")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return DEFAULT_PARALLEL


# A header's values past these are not a model's (the header comes from an untrusted
# source): such a header is one we cannot use, and the estimate is the file's size.
PLAUSIBLE: Final = {
    "block_count": 16_384,
    "embedding_length": 1 << 20,
    "head_count": 1 << 16,
    "head_count_kv": 1 << 16,
    "key_length": 1 << 16,
    "value_length": 1 << 16,
    "context_length": 1 << 27,
    "vocab_size": 1 << 26,
}
MAX_ARCHITECTURE: Final = 64


def implausible(summary: GgufSummary) -> str | None:
    """Why the summary's values are not a model's, or None."""
    for name, bound in PLAUSIBLE.items():
        value = getattr(summary, name)
        if value is not None and not 0 <= value <= bound:
            return f"{name} {value} is not a model's"
    if summary.architecture is not None and len(summary.architecture) > MAX_ARCHITECTURE:
        return "the architecture's name is not a model's"
    if not 0 <= summary.tensor_bytes <= SAFE_INT_MAX:
        return "the tensors' size is past any device"
    return None


def _from_file_size(file_size: int, parallel: int, why: str) -> MemoryEstimate:
    # A source's claimed size may be anything up to what the wire carries: every figure
    # is clamped to that bound (such a need fits no device, and says so) rather than
    # raising past it.
    file_size = min(max(file_size, 0), SAFE_INT_MAX)
    overhead = max(UNKNOWN_OVERHEAD_FLOOR, file_size // 4)
    kv, compute = overhead // 2, overhead - overhead // 2
    return MemoryEstimate(
        weights_bytes=file_size,
        kv_cache_bytes=kv,
        compute_bytes=compute,
        total_bytes=min(file_size + overhead, SAFE_INT_MAX),
        source="file_size",
        parallel=parallel,
        detail=f"{why}: the file's size for the weights, a quarter of it (at least 1 GiB)"
        " for the KV cache and compute buffers"[:300],
    )


def estimate(
    summary: GgufSummary | None, file_size: int, settings: LlamaSettings
) -> MemoryEstimate:
    """What one replica needs on its device, in bytes: from the header's summary, or
    from the file's size when there is none or its values are not a model's (or its
    figures would pass what the wire carries)."""
    parallel = _parallel(settings)
    if summary is None:
        return _from_file_size(file_size, parallel, "the GGUF header could not be read")
    if (why := implausible(summary)) is not None:
        return _from_file_size(file_size, parallel, f"the GGUF header is unusable ({why})")
    n_ctx = _context(summary, settings)
    layers = summary.block_count or 0
    heads = summary.head_count or 0
    heads_kv = summary.head_count_kv if summary.head_count_kv is not None else heads
    embd = summary.embedding_length or 0
    head_dim = embd // heads if heads else 0
    key_len = summary.key_length or head_dim
    value_len = summary.value_length or head_dim
    # llama-server's context is one cache shared by its parallel slots (each slot gets
    # n_ctx / parallel): the cache is sized by the total, whatever `parallel` is.
    per_token = heads_kv * (
        key_len * _cache_bytes_per_element(settings.server_args.get("cache-type-k"))
        + value_len * _cache_bytes_per_element(settings.server_args.get("cache-type-v"))
    )
    kv = int(n_ctx * layers * per_token)
    ubatch = min(settings.ubatch_size or DEFAULT_UBATCH, settings.batch_size or 1 << 62, n_ctx)
    compute = (
        COMPUTE_FLOOR
        + ubatch * 4 * ACTIVATION_FACTOR * embd
        + parallel * 4 * (summary.vocab_size or 0)
    )
    if settings.flash_attn is False:
        compute += ubatch * n_ctx * heads * 4
    weights = summary.tensor_bytes
    if weights + kv + compute > SAFE_INT_MAX:
        return _from_file_size(
            file_size, parallel, "the GGUF header's figures pass what the wire carries"
        )
    return MemoryEstimate(
        weights_bytes=weights,
        kv_cache_bytes=kv,
        compute_bytes=compute,
        total_bytes=weights + kv + compute,
        source="gguf_header",
        context_size=n_ctx,
        parallel=parallel,
        detail=f"{summary.architecture or 'unknown'}: {layers} layers, {heads_kv} KV heads,"
        f" context {n_ctx} shared by {parallel} slot(s), micro-batch {ubatch}"[:300],
    )


def refine(estimate: MemoryEstimate, evidence_bytes: int | None) -> MemoryEstimate:
    """The estimate, or the figure a probe measured on a node (its device's VRAM used,
    or a CPU server's peak RSS) when there is one: a measurement beats a model of it.
    The parts stay as estimated; the total is the measured one."""
    if evidence_bytes is None or evidence_bytes <= 0:
        return estimate
    return estimate.model_copy(
        update={
            "total_bytes": evidence_bytes,
            "source": "evidence",
            "detail": f"measured {gib(evidence_bytes)} on a node (estimated"
            f" {gib(estimate.total_bytes)})",
        }
    )


def gib(value: int) -> str:
    return f"{value / GiB:.1f} GiB"
