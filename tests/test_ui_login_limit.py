"""The dashboard's login limit holds for the whole control plane (store/ui_logins.py):
five wrong operator keys from one address, then 429 with Retry-After, however many API
processes share the database and whichever of them each try reaches, concurrent tries
included. Real `modelforge api` processes, real PostgreSQL."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import httpx
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from schemas.ui import LOGIN_FIELD, SESSION_COOKIE, UI_LOGIN
from store import ui_logins
from store.models import UiLoginFailure
from tests.api_processes import api_processes
from tests.api_server import OPERATOR_KEY

TRIES = 20
CLIENT = "198.51.100.7"


async def _login(client: httpx.AsyncClient, key: str) -> httpx.Response:
    return await client.post(UI_LOGIN, data={LOGIN_FIELD: key})


async def test_concurrent_wrong_keys_across_two_api_processes_get_five_401s_then_429(
    database_url: str, nats_url: str, tmp_path: Path
) -> None:
    with api_processes(2, database_url, nats_url, tmp_path) as started:
        urls = [url for url, _ in started]
        clients = [httpx.AsyncClient(base_url=url, timeout=30) for url in urls]
        try:
            answers = await asyncio.gather(
                *(_login(clients[i % 2], "not-the-key") for i in range(TRIES))
            )
            statuses = sorted(answer.status_code for answer in answers)
            assert statuses == [401] * ui_logins.MAX_FAILURES + [429] * (
                TRIES - ui_logins.MAX_FAILURES
            ), statuses
            # Past the bound, even the right key waits, on either process.
            for client in clients:
                limited = await _login(client, OPERATOR_KEY)
                assert limited.status_code == 429, limited.text
                assert 1 <= int(limited.headers["Retry-After"]) <= ui_logins.WINDOW_S
                assert "Too many wrong operator keys" in limited.text
                assert SESSION_COOKIE not in limited.headers.get("set-cookie", "")
        finally:
            for client in clients:
                await client.aclose()


async def test_the_window_passes_a_success_clears_and_old_rows_are_pruned(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    limit = ui_logins.LoginLimit(max_failures=3, window_s=60.0)

    async def retry_after(client: str = CLIENT) -> int | None:
        async with sessions() as session, session.begin():
            return await ui_logins.retry_after_s(session, client, limit)

    async def fail(client: str = CLIENT) -> None:
        async with sessions() as session, session.begin():
            assert await ui_logins.retry_after_s(session, client, limit) is None
            await ui_logins.failed(session, client, limit)

    async def age(seconds: float) -> None:
        # The rows as if written that much earlier: the database's clock, not ours.
        async with sessions() as session, session.begin():
            table = UiLoginFailure
            await session.execute(
                update(table).values(failed_at=table.failed_at - timedelta(seconds=seconds))
            )

    async def rows() -> int:
        async with sessions() as session:
            return int((await session.execute(select(func.count(UiLoginFailure.id)))).scalar_one())

    for _ in range(3):
        await fail()
    assert 59 <= (await retry_after() or 0) <= 60
    assert await retry_after("198.51.100.8") is None
    # A minute on, the address may try again; the next failure prunes the old rows.
    await age(60.5)
    assert await retry_after() is None
    await fail("198.51.100.8")
    assert await rows() == 1
    # A success clears its address only.
    await fail()
    async with sessions() as session, session.begin():
        assert await ui_logins.retry_after_s(session, CLIENT, limit) is None
        await ui_logins.succeeded(session, CLIENT)
    assert await rows() == 1
