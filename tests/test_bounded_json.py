"""The bounded reader of outside JSON (schemas/bounded.py), as pure functions: the depth
it measures is the real one, and every hostile answer ends in Unreadable with a short
reason, never RecursionError, never the whole answer in memory."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter

from schemas.bounded import Unreadable, depth, parse, read_capped, read_json
from schemas.hub import REVISION, TREE

pytestmark = pytest.mark.fast

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='ab[]{}"\\ é'),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=30,
)


def nesting(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((nesting(item) for item in value), default=0)
    if isinstance(value, dict):
        return 1 + max((nesting(item) for item in value.values()), default=0)
    return 0


@given(JSON)
def test_the_measured_depth_is_the_real_one(value: Any) -> None:
    assert depth(json.dumps(value).encode()) == nesting(value)


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 200_000 + b"]" * 200_000,
        b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
        # Not a run of one opener: interleaved, so only the count finds it.
        b'[{"a":' * 50_000 + b"1" + b"}]" * 50_000,
    ],
)
def test_deep_nesting_is_refused_before_any_parser_sees_it(raw: bytes) -> None:
    with pytest.raises(Unreadable, match="deeper than 32"):
        parse(raw, TypeAdapter(Any))


def test_a_long_flat_answer_is_measured_quickly() -> None:
    raw = b"[" + b"[],{}," * 1_000_000 + b"1]"
    started = time.monotonic()
    assert depth(raw) == 2
    assert time.monotonic() - started < 2


def test_what_is_not_the_schema_or_not_json_is_refused_by_name() -> None:
    with pytest.raises(Unreadable, match="not JSON"):
        parse(b"<html>", REVISION)
    with pytest.raises(Unreadable, match="sha"):
        parse(b'{"id": "x"}', REVISION)
    with pytest.raises(Unreadable, match=r"0\.path"):
        parse(b'[{"type": "file", "path": 7}]', TREE)
    # A peer's extra fields are ignored; ours are typed.
    assert parse(b'{"sha": "abc", "siblings": [], "cardData": {}}', REVISION).sha == "abc"


async def _chunks(count: int, size: int) -> AsyncIterator[bytes]:
    for _ in range(count):
        yield b" " * size


async def _answer(body: bytes) -> AsyncIterator[bytes]:
    yield body


def test_a_body_past_the_cap_is_refused_as_it_arrives() -> None:
    async def scenario() -> None:
        with pytest.raises(Unreadable, match="larger than 1000"):
            await read_capped(_chunks(10**6, 100), 1000)
        with pytest.raises(Unreadable, match="larger than 1000"):
            await read_capped(_chunks(0, 0), 1000, declared="5000")
        assert await read_capped(_chunks(3, 100), 1000, declared="300") == b" " * 300
        revision = await read_json(_answer(b'{"sha": "abc"}'), REVISION, max_bytes=100)
        assert revision.sha == "abc"

    asyncio.run(scenario())
