"""One bounded reader for JSON that comes from outside ModelForge (the Hub-layout
artifact source, the RoleMesh dispatcher): whatever such a peer answers, reading it costs
bounded memory and time and ends in a typed value or in :class:`Unreadable`.

* **Size**: the body is read as it arrives and refused once it passes `max_bytes`
  (a declared Content-Length above the cap is refused before a byte is read); the bytes
  counted are the decoded ones, so a compressed answer cannot expand past the cap.
* **Depth**: nesting is measured on the raw bytes before anything parses them, so a
  deeply nested answer never reaches a recursive parser (Python's `json` raises
  RecursionError, which callers would not expect and which surfaced as a 500).
* **Schema**: the value is validated into the caller's model; a peer's extra fields
  may be ignored by that model, a missing or mistyped one is refused.

It lives in schemas/ because both the API and the agent read outside answers, and the
agent may import nothing of the server side (tests/agent/test_imports.py).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import AsyncIterable
from typing import Final, TypeVar

from pydantic import TypeAdapter, ValidationError

T = TypeVar("T")

MAX_DEPTH: Final = 32

# A JSON string, escapes included: what may hold brackets that are not structure.
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS: Final = bytes(c for c in range(256) if c not in b"[]{}")
# Arrays and objects alike: an opener becomes `(`, a closer `)`.
_ONE_KIND: Final = bytes.maketrans(b"[]{}", b"()()")
_DELTA: Final = tuple(1 if c == ord("(") else -1 if c == ord(")") else 0 for c in range(256))


class Unreadable(ValueError):
    """An outside answer that is too large, too deeply nested, not JSON, or not of the
    expected shape. `reason` is short and safe to log: never the answer's content."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


async def read_capped(
    chunks: AsyncIterable[bytes], max_bytes: int, *, declared: str | None = None
) -> bytes:
    """The whole body, or Unreadable once it passes `max_bytes`. `declared` is the
    answer's Content-Length header, if any."""
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise Unreadable(f"the answer is larger than {max_bytes} bytes")
    body = bytearray()
    async for chunk in chunks:
        body += chunk
        if len(body) > max_bytes:
            raise Unreadable(f"the answer is larger than {max_bytes} bytes")
    return bytes(body)


def depth(raw: bytes) -> int:
    """How deeply the JSON text nests arrays and objects (0 for a scalar). For text
    that is not JSON the figure may be too high, never too low for valid JSON."""
    brackets = _STRING.sub(b'""', raw).translate(_ONE_KIND, _NOT_BRACKETS)
    if not brackets:
        return 0
    # One pass takes out the innermost pairs (one level, wherever the deepest is), which
    # leaves little to count in a flat answer, however long.
    inner = brackets.replace(b"()", b"")
    if not inner:
        return 1
    return max(itertools.accumulate(map(_DELTA.__getitem__, inner))) + 1


def parse(raw: bytes, schema: TypeAdapter[T], *, max_depth: int = MAX_DEPTH) -> T:
    """`raw` validated into `schema`, or Unreadable."""
    # The common attack needs no counting: a run of openers deeper than allowed.
    if b"[" * (max_depth + 1) in raw or b"{" * (max_depth + 1) in raw:
        raise Unreadable(f"the answer nests deeper than {max_depth} levels")
    if depth(raw) > max_depth:
        raise Unreadable(f"the answer nests deeper than {max_depth} levels")
    try:
        return schema.validate_json(raw)
    except ValidationError as exc:
        # Only the kind and the place of the first error: never the value itself.
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "the answer"
        if first["type"] == "json_invalid":
            raise Unreadable("the answer is not JSON") from None
        raise Unreadable(f"unexpected answer at {where} ({first['type']})") from None
    except RecursionError:  # a parser's own limit, below ours: still a refusal
        raise Unreadable(f"the answer nests deeper than {max_depth} levels") from None


async def read_json(
    chunks: AsyncIterable[bytes],
    schema: TypeAdapter[T],
    *,
    max_bytes: int,
    max_depth: int = MAX_DEPTH,
    declared: str | None = None,
) -> T:
    """Read at most `max_bytes`, then parse: the one way an outside JSON answer is read."""
    raw = await read_capped(chunks, max_bytes, declared=declared)
    return parse(raw, schema, max_depth=max_depth)
