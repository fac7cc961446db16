"""Steps shared by the tests of the gateway's measurements and of autoscale on them
(tests/test_gateway_measurements.py, tests/test_service_autoscale.py): a streamed call
through the gateway, the measurements PostgreSQL holds for a model, a bounded wait."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from schemas.protocol import GATEWAY_CHAT_COMPLETIONS
from store.services import measurements
from store.services.measurements import Measured
from tests.api_server import RunningApi

CHAT = {"model": "smol", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
        "stream": True}  # fmt: skip
# A stream's answer, as a node sends it.
CHUNKS = [b'data: {"choices":[{"delta":{"content":"ok"}}]}\n\n', b"data: [DONE]\n\n"]


def stream(api: RunningApi, secret: str) -> float:
    """A streamed call read to its end: the seconds from sending to its first line."""
    sent = time.monotonic()
    first: float | None = None
    with (
        httpx.Client(base_url=api.base_url, timeout=30) as client,
        client.stream("POST", GATEWAY_CHAT_COMPLETIONS, json=CHAT,
                      headers={"Authorization": f"Bearer {secret}"}) as response,
    ):  # fmt: skip
        assert response.status_code == 200, response.read()
        lines = []
        for line in response.iter_lines():
            if line and first is None:
                first = time.monotonic() - sent
            if line:
                lines.append(line)
    assert lines[-1] == "data: [DONE]", lines
    assert first is not None
    return first


async def measured(sessions: async_sessionmaker[AsyncSession], model: str = "smol") -> Measured:
    """The model's measurements across the API processes' fresh rows."""
    async with sessions() as session:
        return await measurements.read(session, model)


async def until(check: Callable[[], Awaitable[Any]], what: str, timeout_s: float = 20.0) -> Any:
    """Run `check` until it answers something truthy (that answer), or fail at the deadline."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(0.05)
    raise AssertionError(f"not reached in {timeout_s} s: {what} (last: {last!r})")
