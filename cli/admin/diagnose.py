"""What went wrong on the way to the API, said as what to do: an https URL for a server
that speaks plain HTTP (or the other way round), a certificate not trusted, or a server
that answers but is not ModelForge (no error envelope, no correlation id)."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from typing import Final

import httpx

from schemas.protocol import CORRELATION_HEADER

# What OpenSSL says when the other end answered a TLS hello in plain text.
PLAIN_TEXT_REASONS: Final = frozenset(
    {"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "HTTP_REQUEST", "PACKET_LENGTH_TOO_LONG"}
)


def causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def transport(exc: httpx.RequestError, api_url: str) -> str:
    """One line for a request that got no answer from api_url."""
    url = httpx.URL(api_url)
    tls = next((c for c in causes(exc) if isinstance(c, ssl.SSLError)), None)
    if isinstance(tls, ssl.SSLCertVerificationError):
        return (
            f"cannot reach the API at {api_url}: its certificate is not trusted "
            f"({tls.verify_message or tls.reason})"
        )
    if tls is not None and (
        str(tls.reason) in PLAIN_TEXT_REASONS or "wrong version number" in str(tls)
    ):
        return (
            f"the server at {api_url} speaks plain HTTP, not HTTPS; "
            f"use {url.copy_with(scheme='http')}"
        )
    if url.scheme == "http" and isinstance(exc, httpx.RemoteProtocolError):
        return (
            f"the server at {api_url} closed the connection without an answer; if it "
            f"speaks HTTPS, use {url.copy_with(scheme='https')}"
        )
    if isinstance(exc, httpx.TransportError):
        return (
            f"cannot reach the API at {api_url} ({type(exc).__name__}): is it running there? "
            "(--api-url or MODELFORGE_API_URL, else the running `modelforge up`, say where)"
        )
    return f"no answer from the API at {api_url} ({type(exc).__name__})"


def ours(response: httpx.Response) -> bool:
    """Every answer of the API carries a correlation id; another server's does not."""
    return CORRELATION_HEADER in response.headers


def foreign(response: httpx.Response, api_url: str) -> str:
    """One line for an answer from a server that is not a ModelForge API."""
    kind = response.headers.get("content-type", "no content type").split(";")[0]
    return (
        f"{api_url} does not look like a ModelForge API: it answered "
        f"{response.request.method} {response.request.url.path} with "
        f"{response.status_code} {response.reason_phrase} ({kind}) and no correlation id; "
        "check --api-url or MODELFORGE_API_URL"
    )
