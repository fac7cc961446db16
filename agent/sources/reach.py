"""Where an artifact source may send the agent. The endpoint is the node's own setting,
but what it answers is not: a mirror gone wrong, or a Hub repository's redirect, could
point the node's GET at its cloud metadata service (169.254.169.254), at a service on
its loopback, or at the office network behind it. A blind GET is still a request the
node did not mean to make.

* **Redirects** are followed by hand (at most MAX_REDIRECTS), each checked against the
  configured endpoint: http or https only, never from https down to http, and never to
  an address more internal than the endpoint's own (a public Hub may not send the node
  to a private or a loopback address; a mirror on the LAN may send it within the LAN).
  The token goes only to the endpoint's origin.
* **Addresses**: the session's resolver refuses a name that resolves to a link-local,
  unspecified or multicast address, whoever asked for it, so a DNS name that points at
  the metadata service is refused like the literal address; and a name other than the
  endpoint's may resolve no further in than the endpoint's own addresses (a public Hub's
  redirect to `intranet.example` that resolves to 10.0.0.7 is refused like 10.0.0.7).

What is not caught: a name whose record changes between the resolver's answer and the
connect (the connector connects to the address the resolver returned, so there is none
in aiohttp), and a proxy from the environment, which resolves for the agent where
`trust_env` is on.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from enum import IntEnum
from typing import Final

from aiohttp import DefaultResolver
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

MAX_REDIRECTS: Final = 5
REDIRECTS: Final = frozenset({301, 302, 303, 307, 308})


class Reach(IntEnum):
    """How far inside the network an address is: a redirect may not go further in than
    the endpoint is."""

    PUBLIC = 0
    PRIVATE = 1
    LOOPBACK = 2


def reach_of(host: str | None) -> Reach | None:
    """The reach of a URL's host; None for an address no source is ever at (link-local,
    unspecified, multicast, reserved). A name is taken as public: its addresses are the
    resolver's to check."""
    if not host:
        return None
    name = host.strip("[]").lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return Reach.LOOPBACK
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return Reach.PUBLIC
    return _address_reach(address)


def _address_reach(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> Reach | None:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_link_local or address.is_unspecified or address.is_multicast:
        return None
    if address.is_loopback:
        return Reach.LOOPBACK
    if address.is_private:
        return Reach.PRIVATE
    if address.is_reserved:
        return None
    return Reach.PUBLIC


def redirect_refusal(endpoint: URL, target: URL) -> str | None:
    """Why the agent will not follow a redirect from `endpoint`'s source to `target`;
    None when it may."""
    if target.scheme not in ("http", "https"):
        return "not an http or https address"
    if endpoint.scheme == "https" and target.scheme == "http":
        return "from https down to plain http"
    reach = reach_of(target.host)
    if reach is None:
        return "a link-local, unspecified, multicast or reserved address"
    endpoint_reach = reach_of(endpoint.host)
    if reach > (Reach.PUBLIC if endpoint_reach is None else endpoint_reach):
        return f"a {reach.name.lower()} address, further in than the endpoint"
    return None


def same_origin(a: URL, b: URL) -> bool:
    return (a.scheme, a.host, a.port) == (b.scheme, b.host, b.port)


class GuardedResolver(AbstractResolver):
    """aiohttp's resolver, less the addresses no source is ever at, and, for any name
    but the endpoint's, less the addresses further in than the endpoint's own."""

    def __init__(self, endpoint: URL | None = None, inner: AbstractResolver | None = None) -> None:
        self._inner = inner or DefaultResolver()
        self._endpoint = _name(endpoint.host) if endpoint is not None else None
        # How far in the endpoint is: known now for an address or localhost, learned
        # from its first resolution for a name. No endpoint: no limit but the above.
        self._limit: Reach | None = None
        if endpoint is None:
            self._limit = Reach.LOOPBACK
        elif reach_of(endpoint.host) is not Reach.PUBLIC or _is_address(self._endpoint):
            self._limit = reach_of(endpoint.host)

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        allowed = await self._allowed(host, port, family)
        if _name(host) != self._endpoint:
            limit = await self._endpoint_limit(port, family)
            allowed = [(r, reach) for r, reach in allowed if limit is not None and reach <= limit]
        if not allowed:
            # OSError is what a failed lookup raises: the connector reports it as such.
            raise OSError(f"{host} resolves only to addresses no artifact source is at")
        return [result for result, _ in allowed]

    async def _allowed(
        self, host: str, port: int, family: socket.AddressFamily
    ) -> list[tuple[ResolveResult, Reach]]:
        results = await self._inner.resolve(host, port, family)
        reached = [(r, _address_reach(ipaddress.ip_address(r["host"]))) for r in results]
        allowed = [(r, reach) for r, reach in reached if reach is not None]
        if _name(host) == self._endpoint and allowed:
            self._limit = max(reach for _, reach in allowed)
        return allowed

    async def _endpoint_limit(self, port: int, family: socket.AddressFamily) -> Reach | None:
        if self._limit is None and self._endpoint is not None:
            with contextlib.suppress(OSError):
                await self._allowed(self._endpoint, port, family)
        return self._limit

    async def close(self) -> None:
        await self._inner.close()


def _name(host: str | None) -> str:
    return (host or "").strip("[]").lower().rstrip(".")


def _is_address(host: str | None) -> bool:
    try:
        ipaddress.ip_address(host or "")
    except ValueError:
        return False
    return True
