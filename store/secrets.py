"""Secrets: generation, wire format, digests and constant-time comparison, for every
secret ModelForge issues or checks: enrollment tokens, node credentials and service
clients (the rules in store/enrollment.py, store/node_credentials.py, store/tokens.py,
store/deployments/service_clients.py; the gateway parses its header in
api/gateway/auth.py), the operator key (api/deps.py). Pure functions, in store/ so that
the rules and the API both reach them; the prefixes and lengths are schemas/protocol.py's.

Wire format ``<prefix>.<id hex>.<secret>``, parsed byte for byte (schemas/protocol.py:
secret_pattern): the id finds the row by primary key, and
only then is the secret's digest compared in constant time, so the database index is
never used as a timing oracle for the secret itself.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from dataclasses import dataclass

from schemas.protocol import SECRET_BYTES, secret_pattern

# Compared against when no row exists, so unknown ids cost the same as wrong secrets.
_DUMMY_DIGEST = hashlib.sha256(b"modelforge-dummy").digest()


@dataclass(frozen=True)
class PresentedSecret:
    id: uuid.UUID
    secret: str


@dataclass(frozen=True)
class IssuedSecret:
    id: uuid.UUID
    wire: str
    digest: bytes


def digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def issue(prefix: str, secret_id: uuid.UUID | None = None) -> IssuedSecret:
    """A new secret; under `secret_id` when it replaces one (a rotation keeps the id)."""
    secret_id = secret_id or uuid.uuid4()
    secret = secrets.token_urlsafe(SECRET_BYTES)
    return IssuedSecret(
        id=secret_id, wire=f"{prefix}.{secret_id.hex}.{secret}", digest=digest(secret)
    )


def parse(prefix: str, wire: str) -> PresentedSecret | None:
    """None when the value is not exactly the spelling `issue` gives out (wrong prefix,
    shape, case, length or anything around it): one secret has one spelling, so no
    other string is ever compared against its digest."""
    match = secret_pattern(prefix).fullmatch(wire)
    if match is None:
        return None
    return PresentedSecret(id=uuid.UUID(hex=match.group(1)), secret=match.group(2))


def matches(presented: str, stored_digest: bytes | None) -> bool:
    return hmac.compare_digest(digest(presented), stored_digest or _DUMMY_DIGEST) and (
        stored_digest is not None
    )


def same_secret(presented: str, expected: str) -> bool:
    # Digests first so the comparison time doesn't depend on the lengths either.
    return hmac.compare_digest(digest(presented), digest(expected))
