"""A model file's GGUF header, fetched from the artifact source without the file: the
scheduler's memory estimate needs only the header (store/services/estimate.py).

`{endpoint}/{repository}/resolve/{commit}/{path}` (the Hub layout the agents download
from, agent/sources/hub.py) with an HTTP Range for a prefix: FIRST_BYTES first, then,
once, the rest up to `max_bytes` when the header runs longer (a large tokenizer). A
source that ignores the Range is read only as far as the bytes wanted, then the
connection is closed. Each read is bounded in time as a whole (a source that trickles
bytes is given up), not only between its bytes. Redirects (the Hub sends LFS files to
its CDN) are followed a few times, the token only to the endpoint's own origin. The
prefix is asked for unencoded (`Accept-Encoding: identity`); an answer compressed anyway
is refused, never decoded (a small gzip answer could decompress to gigabytes).

Not checked here: where a redirect points. The agent refuses a redirect to an address
more internal than its endpoint, or to a link-local one (agent/sources/reach.py), but
that rule lives in agent/, which the API may not import; the API's own endpoint is an
operator's setting, its redirects are not.

Best effort: a source that cannot be reached, answers an error, or a header that cannot
be read gives None (and a log line, never the answer's body); the estimate then falls
back to the file's size.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final
from urllib.parse import quote, urljoin, urlsplit

import httpx

from schemas.hub import SOURCE_URL_ENV, source_shown
from store.services.estimate import GgufSummary, HeaderTruncated, HeaderUnreadable, parse_header

# Most headers (the metadata and the tensor infos) fit here; a tokenizer of a few
# hundred thousand strings takes several MiB, fetched by the one follow-up read.
FIRST_BYTES: Final = 2 * 1024 * 1024
MAX_REDIRECTS: Final = 3

logger = logging.getLogger("modelforge.api.model_headers")


class _Unreachable(Exception):
    """The source did not give the bytes (its reason is safe to log)."""


class ModelHeaders:
    def __init__(
        self,
        endpoint: str,
        token: str | None,
        timeout_s: float = 10.0,
        max_bytes: int = 32 * 1024 * 1024,
    ) -> None:
        self._endpoint = endpoint.rstrip("/")
        self._origin = _origin(self._endpoint)
        self._token = token
        self._max_bytes = max_bytes
        # httpx's timeout bounds each socket operation, not a read: a source that
        # trickles a chunk inside it each time would hold a create for the whole prefix.
        self._timeout_s = timeout_s
        self._http = httpx.AsyncClient(timeout=timeout_s, trust_env=False)

    async def close(self) -> None:
        await self._http.aclose()

    async def summary(self, repository: str, commit: str, path: str) -> GgufSummary | None:
        """The file's header summary, or None when it cannot be had."""
        url = (
            f"{self._endpoint}/{quote(repository, safe='/')}/resolve/{commit}/"
            f"{quote(path, safe='/')}"
        )
        where = f"{repository}@{commit}:{path}"
        try:
            data = await self._read(url, 0, min(FIRST_BYTES, self._max_bytes))
            try:
                return await _parsed(data)
            except HeaderTruncated:
                if len(data) >= self._max_bytes or len(data) < min(FIRST_BYTES, self._max_bytes):
                    raise  # the whole file, or all we may read, and still no header
            data += await self._read(url, len(data), self._max_bytes - len(data))
            return await _parsed(data)
        except HeaderUnreadable as exc:
            logger.warning("no GGUF header for %s: %s", where, exc)
        except (_Unreachable, httpx.HTTPError) as exc:
            logger.warning(
                "no GGUF header for %s: the source %s %s (%s)",
                where,
                source_shown(self._endpoint),
                _reason(exc),
                SOURCE_URL_ENV,
            )
        return None

    async def _read(self, url: str, start: int, count: int) -> bytes:
        """At most `count` bytes of the file from `start`, by a Range request, within
        the timeout (redirects included); a source that ignores the Range (200) is
        skipped to `start` and cut at `count`."""
        try:
            async with asyncio.timeout(self._timeout_s):
                return await self._read_within(url, start, count)
        except TimeoutError:
            raise _Unreachable(f"sent the header slower than {self._timeout_s} s") from None

    async def _read_within(self, url: str, start: int, count: int) -> bytes:
        # identity: a compressed answer could decompress to many times the bytes read
        # (each chunk up to tens of MiB); one encoded anyway is refused, never decoded.
        headers = {"Range": f"bytes={start}-{start + count - 1}", "Accept-Encoding": "identity"}
        for _ in range(MAX_REDIRECTS + 1):
            sent = dict(headers)
            if self._token and _origin(url) == self._origin:
                sent["Authorization"] = f"Bearer {self._token}"
            async with self._http.stream("GET", url, headers=sent) as response:
                if response.is_redirect:
                    location = response.headers.get("Location")
                    if not location:
                        raise _Unreachable("redirected nowhere")
                    url = urljoin(url, location)
                    continue
                if response.status_code not in (200, 206):
                    raise _Unreachable(f"answered {response.status_code}")
                encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
                if encoding not in ("", "identity"):
                    raise _Unreachable(f"answered encoded ({encoding[:32]}) though asked not to")
                skip = start if response.status_code == 200 else 0
                return await _prefix(response, skip, count)
        raise _Unreachable(f"redirected more than {MAX_REDIRECTS} times")


async def _parsed(data: bytes) -> GgufSummary:
    """parse_header off the event loop: within its bounds a hostile header (millions of
    strings or tensors in 32 MiB) still takes seconds of CPU, which on the loop would
    stall every request this API process serves meanwhile."""
    return await asyncio.to_thread(parse_header, data)


async def _prefix(response: httpx.Response, skip: int, count: int) -> bytes:
    """`count` bytes after the first `skip`, then stop reading."""
    chunks: list[bytes] = []
    held = 0
    async for chunk in response.aiter_raw():  # never decoded (see _read_within)
        if skip:
            dropped = min(skip, len(chunk))
            chunk, skip = chunk[dropped:], skip - dropped
        chunks.append(chunk[: count - held])
        held += len(chunks[-1])
        if held >= count:
            break
    return b"".join(chunks)


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme, parts.netloc


def _reason(exc: Exception) -> str:
    if isinstance(exc, _Unreachable):
        return str(exc)
    return f"could not be reached ({type(exc).__name__})"
