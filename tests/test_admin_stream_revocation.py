"""The admin event stream ends with its credential (api/admin/events.py): a stream opened
with a dashboard session closes within one keep-alive of that session's logout (in this
API process or another) or of its expiry, and the CLI's watch stops, refused, once the
operator key it holds is no longer the API's. Real API, relay, NATS and PostgreSQL; the
dashboard's own EventSource is in tests/test_ui_dashboard.py."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable

import httpx
import pytest
from fastapi import FastAPI

from api.ui.session import UiSessions
from schemas.protocol import ADMIN_EVENTS
from schemas.ui import CSRF_COOKIE, CSRF_HEADER, LOGIN_FIELD, SESSION_COOKIE, UI_LOGIN, UI_LOGOUT
from tests.admin_helpers import refused, watching
from tests.api_server import OPERATOR_KEY, ApiFactory, RunningApi
from tests.cli_support import COMMAND_S, Running
from tests.flows import TOKENS

pytest_plugins = ["tests.cli_fixtures"]

KEEPALIVE_S = 1.0
# One keep-alive, plus room for a loaded machine; the stream must not wait longer.
CLOSE_S = KEEPALIVE_S * 4


@pytest.fixture
def api(api_factory: ApiFactory) -> RunningApi:
    return api_factory(notification_keepalive_s=KEEPALIVE_S)


def _session(api: RunningApi) -> dict[str, str]:
    """A dashboard login's cookies (the session and its CSRF token)."""
    with api.client() as client:
        answer = client.post(UI_LOGIN, data={LOGIN_FIELD: OPERATOR_KEY})
        assert answer.status_code == 303, answer.text
        return {name: client.cookies[name] for name in (SESSION_COOKIE, CSRF_COOKIE)}


def _token(api: RunningApi, note: str) -> None:
    with api.client() as client:
        created = client.post(TOKENS, json={"note": note}, headers=api.admin_headers)
        assert created.status_code == 201, created.text


async def test_a_session_stream_closes_within_a_keepalive_of_a_logout_anywhere(
    api: RunningApi, api_factory: ApiFactory
) -> None:
    # The stream on one API process, the logout on another: it hears it (NOTIFY).
    other = api_factory(pipeline=False, notification_keepalive_s=KEEPALIVE_S)
    cookies = _session(api)
    async with watching(api, cookies=cookies) as stream:
        _token(api, "before the logout")
        assert (await stream.until("token.created")).action == "token.created"
        # Open across several keep-alives while the session is good.
        await asyncio.sleep(KEEPALIVE_S * 3)
        assert not stream.closed.is_set()
        with other.client(cookies=cookies) as browser:
            answer = browser.post(UI_LOGOUT, headers={CSRF_HEADER: cookies[CSRF_COOKIE]})
            assert answer.status_code == 204
        await asyncio.wait_for(stream.closed.wait(), CLOSE_S)
    with api.client(cookies=cookies) as stale:
        refused(stale.get(ADMIN_EVENTS), 401, "admin_token_missing")


async def test_a_session_stream_closes_when_the_session_expires(api: RunningApi) -> None:
    app = api.server.config.app
    assert isinstance(app, FastAPI)
    sessions = app.state.ui_sessions
    assert isinstance(sessions, UiSessions)
    # Sessions issued from now on last 3 s (a whole second of the cookie's expiry).
    sessions.ttl_s = 3.0
    cookies = _session(api)
    async with watching(api, cookies=cookies) as stream:
        _token(api, "while the session lives")
        await stream.until("token.created")
        await asyncio.wait_for(stream.closed.wait(), sessions.ttl_s + CLOSE_S)
    with api.client(cookies=cookies) as stale:
        refused(stale.get(ADMIN_EVENTS), 401, "admin_token_missing")


async def test_a_key_stream_outlives_a_dashboard_logout(api: RunningApi) -> None:
    """The stream re-checks its own credential: a logout ends sessions, not the key."""
    cookies = _session(api)
    async with watching(api) as stream:
        with api.client(cookies=cookies) as browser:
            answer = browser.post(UI_LOGOUT, headers={CSRF_HEADER: cookies[CSRF_COOKIE]})
            assert answer.status_code == 204
        await asyncio.sleep(KEEPALIVE_S * 3)
        assert not stream.closed.is_set()
        _token(api, "after a logout")
        await stream.until("token.created")


def test_the_cli_watch_stops_refused_once_the_operator_key_changes(
    api: RunningApi, api_factory: ApiFactory, background: Callable[..., Running]
) -> None:
    """The operator key is the API's setting (MODELFORGE_OPERATOR_API_KEY, or the key file
    `up` passes in it): it changes when the API restarts with another. The watch's stream
    ends as the old API stops; its reconnect, with the old key, is refused, and the
    watch says so and exits rather than retrying or going on."""
    watch = background("nodes", "watch", "--json")
    watch.line(lambda line: line.startswith('{"items"'))
    port = api.settings.port
    api.stop()
    api_factory(port=port, operator_api_key="another-operator-key-0123456789abcdef")
    try:
        status = watch.process.wait(timeout=COMMAND_S)
    except subprocess.TimeoutExpired:
        raise AssertionError("the watch goes on with a key the API no longer holds") from None
    assert watch.process.stderr is not None
    error = watch.process.stderr.read()
    assert status == 1, error
    assert "admin_token_invalid" in error and "Traceback" not in error, error
    # Nothing reached the new API with the old key but refusals.
    with httpx.Client(base_url=api.base_url, timeout=10) as old:
        refused(old.get(ADMIN_EVENTS, headers=api.admin_headers), 401, "admin_token_invalid")
