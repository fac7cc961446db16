"""Dashboard sessions: a signed, expiring cookie instead of the operator key in the browser.

Why signed rather than a session table: `modelforge api --processes N` (and replicas
behind a load balancer) share nothing but PostgreSQL and NATS, and a browser's requests
land on any of them. The cookie carries its own expiry and an HMAC under a key derived
from the operator key's digest, so every API process that holds the same operator key
admits it, with no shared session state and no database read per request. Changing the
operator key ends every session at once (the derived key changes with it).

The cookie is HttpOnly and SameSite=Strict, Secure when the request came over https, and
holds no secret of its own but a random nonce: the operator key never reaches the
browser beyond the login form's body. Cross-site requests are refused twice over:
SameSite=Strict keeps the cookie off them, and every state-changing request authenticated
by the cookie must echo the session's CSRF token (derived from the nonce, handed to our
script in a non-HttpOnly cookie) in CSRF_HEADER, which another origin can neither read
nor send.

Logout revokes the nonce in this process at once, and records it in PostgreSQL with a
NOTIFY (store/ui_sessions.py): the other processes hear it within milliseconds, and one
that starts or reconnects later reads the recorded ones first (api/ui/revocations.py),
so a copied cookie is refused everywhere. The browser itself drops both cookies.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from starlette.requests import HTTPConnection

from api.errors import Unauthenticated
from schemas.errors import ErrorCode
from schemas.ui import CSRF_HEADER, SESSION_COOKIE
from store.secrets import same_secret

# Long enough for a shift at the dashboard, short enough to bound a copied cookie.
SESSION_TTL_S: Final = 12 * 3600.0
_VERSION: Final = "v1"
_NONCE_BYTES: Final = 18
# Methods that change nothing: a cookie alone authenticates them (EventSource and the
# page's reads cannot send headers, or need not).
SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _same(presented: str, expected: str) -> bool:
    # Bytes: compare_digest refuses a str with characters outside ASCII, which a
    # header or cookie may carry.
    return hmac.compare_digest(presented.encode(), expected.encode())


@dataclass(frozen=True)
class Session:
    nonce: str
    expires_at: int


@dataclass(frozen=True)
class Issued:
    cookie: str
    csrf_token: str
    max_age_s: int


@dataclass
class UiSessions:
    """Issues, checks and revokes sessions for one API process (built in create_app)."""

    operator_key: str | None
    ttl_s: float = SESSION_TTL_S
    clock: Callable[[], float] = time.time
    # Revoked nonces and when they would have expired anyway (then they are forgotten).
    _revoked: dict[str, int] = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        return bool(self.operator_key)

    def matches_key(self, presented: str) -> bool:
        """The login's check: the operator key, compared in constant time."""
        return bool(presented) and self.enabled and same_secret(presented, self.operator_key or "")

    def _key(self) -> bytes:
        assert self.operator_key
        # From the key's digest, so the key itself is never an HMAC key anywhere, and
        # under a label of its own, so the MAC is not usable as anything else.
        return hmac.new(
            hashlib.sha256(self.operator_key.encode()).digest(),
            b"modelforge.ui.session.v1",
            hashlib.sha256,
        ).digest()

    def _mac(self, payload: str) -> str:
        return _b64(hmac.new(self._key(), payload.encode(), hashlib.sha256).digest())

    def issue(self) -> Issued:
        expires_at = int(self.clock() + self.ttl_s)
        nonce = _b64(secrets.token_bytes(_NONCE_BYTES))
        payload = f"{_VERSION}.{expires_at}.{nonce}"
        session = Session(nonce=nonce, expires_at=expires_at)
        return Issued(
            cookie=f"{payload}.{self._mac(payload)}",
            csrf_token=self.csrf_token(session),
            max_age_s=int(self.ttl_s),
        )

    def check(self, cookie: str | None) -> Session | None:
        """The session a cookie stands for, or None (absent, forged, expired, revoked)."""
        if not cookie or not self.enabled:
            return None
        parts = cookie.split(".")
        if len(parts) != 4 or parts[0] != _VERSION or not parts[1].isdigit():
            return None
        payload = ".".join(parts[:3])
        if not _same(parts[3], self._mac(payload)):
            return None
        session = Session(nonce=parts[2], expires_at=int(parts[1]))
        if session.expires_at <= self.clock() or session.nonce in self._revoked:
            return None
        return session

    def csrf_token(self, session: Session) -> str:
        return self._mac(f"csrf.{session.nonce}")

    def revoke(self, session: Session) -> None:
        self.revoke_nonce(session.nonce, session.expires_at)

    def revoke_nonce(self, nonce: str, expires_at: int) -> None:
        """End a session, here or (api/ui/revocations.py) in another process."""
        now = self.clock()
        for known, expiry in list(self._revoked.items()):
            if expiry <= now:
                del self._revoked[known]
        if expires_at > now:
            self._revoked[nonce] = expires_at

    def of(self, connection: HTTPConnection) -> Session | None:
        return self.check(connection.cookies.get(SESSION_COOKIE))

    def admits(self, connection: HTTPConnection) -> bool:
        """Whether the request's session cookie stands in for the operator key: a live
        session, and for a state-changing method its CSRF token in CSRF_HEADER (without
        it, a refusal that says so)."""
        session = self.of(connection)
        if session is None:
            return False
        method = connection.scope.get("method", "GET")
        if method in SAFE_METHODS:
            return True
        if not _same(connection.headers.get(CSRF_HEADER, ""), self.csrf_token(session)):
            raise Unauthenticated(
                f"{CSRF_HEADER} is required with a session cookie",
                code=ErrorCode.ADMIN_TOKEN_MISSING,
            )
        return True


def sessions_of(connection: HTTPConnection) -> UiSessions | None:
    """The app's sessions (create_app puts them on app.state); None in an app without."""
    found = getattr(connection.app.state, "ui_sessions", None)
    return found if isinstance(found, UiSessions) else None


def admitted_by_session(connection: HTTPConnection) -> bool:
    """For the operator check (api/deps.py): a request without the key header that a
    dashboard session admits."""
    sessions = sessions_of(connection)
    return sessions is not None and sessions.admits(connection)
