"""The dashboard's own routes (UI_PREFIX, schemas/ui.py): its pages, its assets, login and
logout. Everything the pages show comes from the admin API itself (api/admin/), which
admits the session cookie in place of the operator key (api/deps.py: require_operator,
api/ui/session.py), so the dashboard has no data routes of its own.

Offline by construction: every asset is a file of this package (api/ui/static/), served
from memory, and the Content-Security-Policy lets a page load nothing from elsewhere.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib.resources import files
from typing import Final
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from api.errors import NotFound
from api.state import state_of
from api.ui.session import UiSessions
from schemas.ui import (
    CSRF_COOKIE,
    LOGIN_FIELD,
    SESSION_COOKIE,
    UI_ASSETS,
    UI_LOGIN,
    UI_LOGOUT,
    UI_PATHS,
    UI_PREFIX,
    UiPaths,
)
from store import ui_logins, ui_sessions

logger = logging.getLogger("modelforge.api.ui")

# Nothing but this origin: no CDN, no inline script or style, no framing.
CSP: Final = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
_HEADERS: Final = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
_TYPES: Final = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
# Where the login page says why it is shown again; static text, never the input.
_ERROR_SLOT: Final = "<!--error-->"
_LOGIN_REFUSED: Final = '<p class="error" role="alert">Invalid operator key.</p>'
_LOGIN_LIMITED: Final = (
    '<p class="error" role="alert">Too many wrong operator keys: try again in a minute.</p>'
)
_ADMIN_DISABLED: Final = (
    '<p class="error" role="alert">The admin API is disabled: '
    "MODELFORGE_OPERATOR_API_KEY is not set.</p>"
)
# A form body holds one key; anything longer is not a login.
_LOGIN_BODY_MAX: Final = 16 * 1024


@dataclass(frozen=True)
class Assets:
    """The package's static files, read once: name -> (bytes, media type)."""

    by_name: dict[str, tuple[bytes, str]]

    @classmethod
    def load(cls) -> Assets:
        found: dict[str, tuple[bytes, str]] = {}
        for entry in (files("api.ui") / "static").iterdir():
            suffix = "." + entry.name.rsplit(".", 1)[-1]
            if entry.is_file() and suffix in _TYPES:
                found[entry.name] = (entry.read_bytes(), _TYPES[suffix])
        return cls(found)

    def response(self, name: str, status_code: int = 200, error: str = "") -> Response:
        if name not in self.by_name:
            raise NotFound(f"no dashboard asset {name}")
        body, media_type = self.by_name[name]
        if error:
            body = body.replace(_ERROR_SLOT.encode(), error.encode())
        headers = dict(_HEADERS)
        # Pages are never cached (they depend on the session); assets may be, briefly.
        headers["Cache-Control"] = "no-store" if name.endswith(".html") else "max-age=300"
        return Response(body, status_code=status_code, media_type=media_type, headers=headers)


def _redirect(to: str) -> Response:
    return RedirectResponse(to, status_code=303, headers=_HEADERS | {"Cache-Control": "no-store"})


def _clear(response: Response) -> Response:
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
    response.delete_cookie(CSRF_COOKIE, path="/", samesite="strict")
    return response


def ui_router(sessions: UiSessions, assets: Assets) -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get(UI_PREFIX)
    async def dashboard(request: Request) -> Response:
        if sessions.of(request) is None:
            return _redirect(UI_LOGIN)
        return assets.response("index.html")

    @router.get(UI_PREFIX + "/")
    async def dashboard_slash() -> Response:
        return _redirect(UI_PREFIX)

    @router.get(UI_LOGIN)
    async def login_page(request: Request) -> Response:
        if not sessions.enabled:
            return assets.response("login.html", 403, _ADMIN_DISABLED)
        if sessions.of(request) is not None:
            return _redirect(UI_PREFIX)
        return assets.response("login.html")

    @router.post(UI_LOGIN)
    async def login(request: Request) -> Response:
        if not sessions.enabled:
            return assets.response("login.html", 403, _ADMIN_DISABLED)
        body = await request.body()
        form = parse_qs(body[:_LOGIN_BODY_MAX].decode("utf-8", "replace"))
        presented = (form.get(LOGIN_FIELD) or [""])[0]
        client = request.client.host if request.client else ""
        # Counted for the whole control plane (store/ui_logins.py): the address's lock is
        # held from the check until the outcome is recorded, on whichever process.
        async with state_of(request).sessions() as db, db.begin():
            wait_s = await ui_logins.retry_after_s(db, client)
            matches = sessions.matches_key(presented)
            if wait_s is None and matches:
                await ui_logins.succeeded(db, client)
            elif wait_s is None:
                await ui_logins.failed(db, client)
        if wait_s is not None:
            logger.warning("dashboard login refused: too many wrong operator keys")
            refused = assets.response("login.html", 429, _LOGIN_LIMITED)
            refused.headers["Retry-After"] = str(wait_s)
            return refused
        if not matches:
            # Who and why, never what was typed.
            logger.warning("dashboard login refused: wrong operator key")
            return assets.response("login.html", 401, _LOGIN_REFUSED)
        issued = sessions.issue()
        secure = request.url.scheme == "https"
        response = _redirect(UI_PREFIX)
        response.set_cookie(
            SESSION_COOKIE,
            issued.cookie,
            max_age=issued.max_age_s,
            path="/",
            secure=secure,
            httponly=True,
            samesite="strict",
        )
        # Our script reads this one to echo it in CSRF_HEADER; it authenticates nothing.
        response.set_cookie(
            CSRF_COOKIE,
            issued.csrf_token,
            max_age=issued.max_age_s,
            path="/",
            secure=secure,
            httponly=False,
            samesite="strict",
        )
        return response

    @router.post(UI_LOGOUT)
    async def logout(request: Request) -> Response:
        # A cross-site POST cannot log anyone out: it carries no cookie (SameSite) and
        # cannot send the CSRF header (admits refuses it). Without a live session there
        # is nothing to end.
        session = sessions.of(request)
        if session is not None and sessions.admits(request):
            sessions.revoke(session)
            # Every other API process too, and those started later (api/ui/revocations.py).
            state = state_of(request)
            async with state.sessions() as db, db.begin():
                await ui_sessions.record_logout(db, session.nonce, session.expires_at)
        return _clear(Response(status_code=204, headers=_HEADERS))

    @router.get(UI_PATHS)
    async def paths() -> UiPaths:
        return UiPaths()

    @router.get(UI_ASSETS + "/{name}")
    async def asset(name: str) -> Response:
        if name.endswith(".html"):
            raise NotFound(f"no dashboard asset {name}")
        return assets.response(name)

    return router
