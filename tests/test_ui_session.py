"""The dashboard's session (api/ui/session.py, api/ui/routes.py) without a browser: the
signed cookie's rules, and over real HTTP that it stands in for the operator key on the
admin API (the event stream included) but never for a state-changing request without the
CSRF header, that the key header works as before, and that logout ends the session."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import httpx
import pytest

from api.ui.session import UiSessions
from schemas.protocol import ADMIN_EVENTS
from schemas.ui import (
    CSRF_COOKIE,
    CSRF_HEADER,
    LOGIN_FIELD,
    SESSION_COOKIE,
    UI_ASSETS,
    UI_LOGIN,
    UI_LOGOUT,
    UI_PREFIX,
)
from store.ui_logins import MAX_FAILURES
from tests.admin_helpers import refused
from tests.api_server import OPERATOR_KEY, ApiFactory, RunningApi
from tests.flows import NODES, TOKENS

KEY = "k" * 40


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.fast
def test_a_cookie_is_signed_expires_and_can_be_revoked() -> None:
    clock = Clock()
    sessions = UiSessions(KEY, ttl_s=60, clock=clock)
    issued = sessions.issue()
    session = sessions.check(issued.cookie)
    assert session is not None
    assert KEY not in issued.cookie
    # Another process with the same key admits it; a different key does not.
    assert UiSessions(KEY, clock=clock).check(issued.cookie) == session
    assert UiSessions("x" * 40, clock=clock).check(issued.cookie) is None
    # Any change to the payload breaks the signature.
    version, expires, nonce, mac = issued.cookie.split(".")

    def changed(text: str) -> str:
        # The last character replaced by another one (one that ends in "A" already
        # would otherwise be "forged" into itself, 1 run in 64).
        return text[:-1] + ("B" if text.endswith("A") else "A")

    for forged in (
        f"{version}.{int(expires) + 3600}.{nonce}.{mac}",
        f"{version}.{expires}.{changed(nonce)}.{mac}",
        f"{version}.{expires}.{nonce}.{changed(mac)}",
        "v1.1.2",
        "",
        "é.é.é.é",
    ):
        assert sessions.check(forged) is None, forged
    assert sessions.csrf_token(session) == issued.csrf_token
    clock.now += 61
    assert sessions.check(issued.cookie) is None
    clock.now -= 61
    sessions.revoke(session)
    assert sessions.check(issued.cookie) is None
    assert UiSessions(None).check(issued.cookie) is None
    assert not UiSessions("").matches_key("")
    assert sessions.matches_key(KEY) and not sessions.matches_key(KEY + "x")


@contextlib.contextmanager
def _login(api: RunningApi) -> Iterator[httpx.Client]:
    """A client holding a dashboard session."""
    with api.client() as client:
        yield _logged_in(client)


def _logged_in(client: httpx.Client) -> httpx.Client:
    answer = client.post(UI_LOGIN, data={LOGIN_FIELD: OPERATOR_KEY})
    assert answer.status_code == 303, answer.text
    assert answer.headers["location"] == UI_PREFIX
    cookies = answer.headers.get_list("set-cookie")
    session = next(c for c in cookies if c.startswith(SESSION_COOKIE + "="))
    assert "HttpOnly" in session and "SameSite=strict" in session and "Path=/" in session
    # Plain http here: Secure would keep the browser from sending it back.
    assert "Secure" not in session
    return client


def test_the_session_cookie_reads_the_admin_api_and_the_stream(api: RunningApi) -> None:
    with _login(api) as client:
        assert client.get(NODES).status_code == 200
        with client.stream("GET", ADMIN_EVENTS) as stream:
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
        page = client.get(UI_PREFIX)
        assert page.status_code == 200
        assert "default-src 'self'" in page.headers["content-security-policy"]
        assert page.headers["cache-control"] == "no-store"


def test_a_change_by_cookie_needs_the_csrf_header(api: RunningApi) -> None:
    with _login(api) as client:
        refused(client.post(TOKENS, json={"note": "csrf"}), 401, "admin_token_missing")
        wrong = {CSRF_HEADER: "not-the-token"}
        refused(
            client.post(TOKENS, json={"note": "csrf"}, headers=wrong), 401, "admin_token_missing"
        )
        right = {CSRF_HEADER: client.cookies[CSRF_COOKIE]}
        assert client.post(TOKENS, json={"note": "csrf"}, headers=right).status_code == 201


def test_the_key_header_works_as_before(api: RunningApi) -> None:
    with api.client() as client:
        refused(client.get(NODES), 401, "admin_token_missing")
        wrong = {"X-ModelForge-Admin-Token": "not-the-key"}
        refused(client.get(NODES, headers=wrong), 401, "admin_token_invalid")
        assert client.get(NODES, headers=api.admin_headers).status_code == 200
        assert client.post(TOKENS, json={}, headers=api.admin_headers).status_code == 201
        # A forged cookie beside no key is no session.
        client.cookies.set(SESSION_COOKIE, "v1.99999999999.nonce.mac")
        refused(client.get(NODES), 401, "admin_token_missing")


def test_login_refuses_a_wrong_key_and_logout_ends_the_session(api: RunningApi) -> None:
    with api.client() as client:
        wrong = client.post(UI_LOGIN, data={LOGIN_FIELD: "not-the-key"})
        assert wrong.status_code == 401
        assert "Invalid operator key." in wrong.text
        assert SESSION_COOKIE not in wrong.headers.get("set-cookie", "")
        assert client.get(UI_PREFIX).headers["location"] == UI_LOGIN
    with _login(api) as client:
        cookie = client.cookies[SESSION_COOKIE]
        # Without the CSRF header a logout is refused and the session lives on.
        refused(client.post(UI_LOGOUT), 401, "admin_token_missing")
        assert client.get(NODES).status_code == 200
        answer = client.post(UI_LOGOUT, headers={CSRF_HEADER: client.cookies[CSRF_COOKIE]})
        assert answer.status_code == 204
    with api.client(cookies={SESSION_COOKIE: cookie}) as stale:
        refused(stale.get(NODES), 401, "admin_token_missing")
        assert stale.get(UI_PREFIX).headers["location"] == UI_LOGIN


def test_assets_come_from_the_package(api: RunningApi) -> None:
    with api.client() as client:
        script = client.get(f"{UI_ASSETS}/app.js")
        assert script.status_code == 200
        assert script.headers["content-type"].startswith("text/javascript")
        assert "default-src 'self'" in script.headers["content-security-policy"]
        assert client.get(f"{UI_ASSETS}/index.html").status_code == 404
        assert client.get(f"{UI_ASSETS}/..%2Fsession.py").status_code == 404
        assert client.get(f"{UI_ASSETS}/nothing.js").status_code == 404
        login = client.get(UI_LOGIN)
        assert login.status_code == 200
        # Nothing the page loads comes from elsewhere.
        assert "http://" not in login.text and "https://" not in login.text


def test_wrong_keys_are_limited_per_client(api: RunningApi) -> None:
    # The window, the pruning and several processes: tests/test_ui_login_limit.py.
    with api.client() as client:
        for _ in range(MAX_FAILURES):
            assert client.post(UI_LOGIN, data={LOGIN_FIELD: "not-the-key"}).status_code == 401
        # Past the bound, even the right key waits: a guesser cannot tell a hit.
        for key in ("not-the-key", OPERATOR_KEY):
            limited = client.post(UI_LOGIN, data={LOGIN_FIELD: key})
            assert limited.status_code == 429, limited.text
            assert 1 <= int(limited.headers["Retry-After"]) <= 60
            assert "Too many wrong operator keys" in limited.text
            assert SESSION_COOKIE not in limited.headers.get("set-cookie", "")


def test_logout_ends_the_session_in_every_api_process_and_in_later_ones(
    api_factory: ApiFactory,
) -> None:
    first, second = api_factory(), api_factory(pipeline=False)
    with _login(first) as client:
        cookie = client.cookies[SESSION_COOKIE]
        with second.client(cookies={SESSION_COOKIE: cookie}) as elsewhere:
            # A signed cookie: the other process admits it with no shared state.
            assert elsewhere.get(NODES).status_code == 200
            answer = client.post(UI_LOGOUT, headers={CSRF_HEADER: client.cookies[CSRF_COOKIE]})
            assert answer.status_code == 204
            deadline = time.monotonic() + 10
            while elsewhere.get(NODES).status_code != 401:
                assert time.monotonic() < deadline, "the other process still admits the cookie"
                time.sleep(0.05)
            refused(elsewhere.get(NODES), 401, "admin_token_missing")
    # A process started after the logout reads it before it serves.
    with api_factory(pipeline=False).client(cookies={SESSION_COOKIE: cookie}) as later:
        refused(later.get(NODES), 401, "admin_token_missing")
        assert later.get(UI_PREFIX).headers["location"] == UI_LOGIN
