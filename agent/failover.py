"""Several API endpoints of one control plane: one used at a time, the next on failure.

The agent and the runtime worker talk to the control plane through one httpx client;
with `api_urls` set, its transport is a FailoverTransport. Every request goes to the
current endpoint, so a node stays on one API process (its held notification channel,
its connections kept alive) as long as that one answers. When a connection to it cannot
be made, nothing of the request was sent, so the same request is tried at once on the
next endpoint, which becomes the current one. A connection that breaks after the request
went out moves the next request on too, but the failure is the caller's to retry (the
request may have been acted on).

Nothing here tries an endpoint in the background or moves back to the first: sticky
until the current one fails, like a client of a DNS name with several addresses.
"""

from __future__ import annotations

import logging
import urllib.request
from collections.abc import Callable, Sequence

import httpx

logger = logging.getLogger("modelforge.agent.http")

# Failures where the request never reached the endpoint: safe to send elsewhere at once.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout)


def checked_endpoint(url: str, field: str = "api_url") -> str:
    """An API base URL as the configs take it: http(s), no trailing slash."""
    if not url.startswith(("https://", "http://")):
        raise ValueError(f"{field} must start with https:// (or http:// for development)")
    return url.rstrip("/")


def checked_failover(primary: str | None, others: Sequence[str]) -> list[str]:
    """api_urls beside api_url: each a base URL on the same path as api_url (only the
    scheme, host and port are swapped when failing over)."""
    checked = [checked_endpoint(url, "api_urls") for url in others]
    if checked and primary is None:
        raise ValueError("api_urls needs api_url (the first endpoint)")
    if primary is not None:
        path = httpx.URL(primary).path.rstrip("/")
        for url in checked:
            if httpx.URL(url).path.rstrip("/") != path:
                raise ValueError(f"api_urls entry {url} is not on api_url's path {path or '/'}")
        if len({primary, *checked}) != len(checked) + 1:
            raise ValueError("api_urls must not repeat api_url or each other")
    return checked


def environment_proxy(url: str) -> str | None:
    """The proxy HTTP(S)_PROXY / NO_PROXY give for url, as httpx would use it."""
    parsed = httpx.URL(url)
    if urllib.request.proxy_bypass(parsed.host):
        return None
    proxies = urllib.request.getproxies_environment()
    return proxies.get(parsed.scheme) or proxies.get("all")


class FailoverTransport(httpx.AsyncBaseTransport):
    """Sends each request to the current one of `endpoints` (base URLs that differ only
    in scheme, host and port); `transport(endpoint)` builds each one's own pool."""

    def __init__(
        self,
        endpoints: Sequence[str],
        transport: Callable[[str], httpx.AsyncBaseTransport],
    ) -> None:
        if not endpoints:
            raise ValueError("at least one endpoint")
        self._endpoints = [httpx.URL(endpoint) for endpoint in endpoints]
        self._transports = [transport(endpoint) for endpoint in endpoints]
        self._current = 0

    @property
    def current(self) -> str:
        return str(self._endpoints[self._current])

    def _move_on(self, failed: int, exc: Exception) -> None:
        # Requests in flight on the failed endpoint all fail together: only the first
        # to notice moves the others on, so none skips a healthy endpoint.
        if self._current != failed:
            return
        self._current = (failed + 1) % len(self._endpoints)
        logger.warning(
            "API endpoint %s failed (%s); using %s",
            self._endpoints[failed],
            type(exc).__name__,
            self._endpoints[self._current],
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        for attempt in range(len(self._endpoints)):
            index = self._current
            target = self._endpoints[index]
            request.url = request.url.copy_with(
                scheme=target.scheme, host=target.host, port=target.port
            )
            request.headers["Host"] = target.netloc.decode("ascii")
            try:
                return await self._transports[index].handle_async_request(request)
            except _NOT_SENT as exc:
                self._move_on(index, exc)
                if attempt == len(self._endpoints) - 1:
                    raise
            except httpx.TransportError as exc:
                self._move_on(index, exc)
                raise
        raise AssertionError("unreachable")  # the last attempt returns or raises

    async def aclose(self) -> None:
        for transport in self._transports:
            await transport.aclose()
