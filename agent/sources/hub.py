"""A Hugging Face Hub-layout source: `{endpoint}/{repository}/resolve/{commit}/{path}`,
with HTTP Range for resumes; the Hub itself or any mirror that speaks the layout.

Streamed with aiohttp rather than `huggingface_hub` or httpx:
* `hf_hub_download` owns its cache layout, its verification and its retries, while the
  job needs a resume from an exact offset into a staging file we name, a digest of
  whichever kind the job holds (git blob ids included) computed while streaming, a
  stall rule and a reserve check during the download.
* httpx's async client reads about 200 MiB/s on loopback where curl reads 900
  (ops/bench/jobs.py); aiohttp's C parser reads over 1 GiB/s, and its `sock_read`
  timeout is the stall rule exactly: no byte for N seconds.
Redirects are followed (the Hub sends LFS files to a CDN), by hand and only where
agent/sources/reach.py allows; the token (optional) goes only to the configured
endpoint's origin. Bodies are taken as sent (no decompression), since the digest is of
the file's bytes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from urllib.parse import quote

import aiohttp
from yarl import URL

from agent.sources.reach import (
    MAX_REDIRECTS,
    REDIRECTS,
    GuardedResolver,
    redirect_refusal,
    same_origin,
)
from schemas.jobs import FailureCode


class SourceFailed(Exception):
    def __init__(self, code: FailureCode, retryable: bool, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.retryable = retryable
        self.detail = detail


@dataclass(frozen=True)
class Download:
    # Where the body starts: the offset asked for (206), or 0 when the source ignored
    # the Range and sent the whole file (200).
    offset: int
    chunks: AsyncIterator[bytes]


# How much of a body aiohttp holds before it stops reading the socket (it resumes below
# half). Its default, 64 KiB, is less than one read from the socket, so every read
# paused the socket and the next chunk taken resumed it: two epoll changes and a timer
# per chunk, and the sender held up meanwhile.
READ_BUFFER_BYTES = 4 << 20
# At most this much per read from a plain-TCP socket (asyncio's default: 256 KiB). Each
# read costs the same event-loop and aiohttp work whatever its size (a callback, the
# parser, the stall timer rescheduled, a wake-up of the reader); a quarter as many
# reads took about a tenth off the agent's CPU per GiB (ops/bench/README.md).
READ_BYTES = 1 << 20


def source_session(
    endpoint: str, *, stall_s: float, connect_timeout_s: float, trust_env: bool
) -> aiohttp.ClientSession:
    """The HTTP session a HubSource for `endpoint` downloads with (the caller closes
    it); its resolver keeps redirects from going further in than the endpoint."""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s, sock_read=stall_s)
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(resolver=GuardedResolver(URL(endpoint))),
        timeout=timeout,
        trust_env=trust_env,
        auto_decompress=False,
        read_bufsize=READ_BUFFER_BYTES,
    )


async def _as_received(content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """The body's chunks as the socket delivered them: whatever is buffered, never held
    back for a size, and never joined into one (readany copies all it holds into one
    bytes when several chunks wait)."""
    async for chunk, _ in content.iter_chunks():
        if chunk:  # b"" marks the end of an HTTP chunk (chunked transfer coding)
            yield chunk


class HubSource:
    def __init__(self, endpoint: str, token: str | None, session: aiohttp.ClientSession) -> None:
        self.endpoint = endpoint.rstrip("/")
        self._token = token
        self._session = session

    def url(self, repository: str, commit: str, path: str) -> str:
        return (
            f"{self.endpoint}/{quote(repository, safe='/')}/resolve/{commit}/"
            f"{quote(path, safe='/')}"
        )

    @asynccontextmanager
    async def open(
        self, repository: str, commit: str, path: str, offset: int
    ) -> AsyncIterator[Download]:
        stall_s = self._session.timeout.sock_read
        try:
            async with self._followed(URL(self.url(repository, commit, path)), offset) as response:
                _check(response.status, path)
                start = offset if response.status == 206 else 0
                _read_larger(response)
                yield Download(start, _as_received(response.content))
        except RedirectRefused as refused:
            raise SourceFailed(
                FailureCode.SOURCE_UNAVAILABLE, False, f"{path}: redirect refused ({refused})"
            ) from None
        except TimeoutError:
            raise SourceFailed(
                FailureCode.STALLED, True, f"{path}: no data for {stall_s:g} s"
            ) from None
        except aiohttp.ClientError as exc:
            raise SourceFailed(
                FailureCode.SOURCE_UNAVAILABLE, True, f"{path}: {type(exc).__name__}"
            ) from None

    @asynccontextmanager
    async def _followed(self, url: URL, offset: int) -> AsyncIterator[aiohttp.ClientResponse]:
        """The answer at the end of the source's redirects, each one allowed first."""
        endpoint = URL(self.endpoint)
        async with AsyncExitStack() as stack:
            for _ in range(MAX_REDIRECTS + 1):
                headers = {"Accept-Encoding": "identity"}
                if offset:
                    headers["Range"] = f"bytes={offset}-"
                if self._token and same_origin(url, endpoint):
                    headers["Authorization"] = f"Bearer {self._token}"
                response = await stack.enter_async_context(
                    self._session.get(url, headers=headers, allow_redirects=False)
                )
                location = response.headers.get("Location")
                if response.status not in REDIRECTS or location is None:
                    yield response
                    return
                try:
                    target = url.join(URL(location))
                except ValueError:
                    raise RedirectRefused("a Location that is no URL") from None
                if (why := redirect_refusal(endpoint, target)) is not None:
                    raise RedirectRefused(why)
                response.release()
                url = target
            raise RedirectRefused(f"more than {MAX_REDIRECTS} redirects")


class RedirectRefused(Exception):
    """A redirect the source may not send the agent to (its reason, safe to log)."""


def _read_larger(response: aiohttp.ClientResponse) -> None:
    """Let the connection's transport read up to READ_BYTES at a time. asyncio's socket
    transport reads `max_size` bytes per call, an attribute it does not document; any
    other transport (TLS, uvloop) is left as it is."""
    connection = response.connection
    transport = connection.transport if connection is not None else None
    size = getattr(transport, "max_size", None)
    if isinstance(size, int) and size < READ_BYTES:
        setattr(transport, "max_size", READ_BYTES)  # noqa: B010  (not in asyncio's types)


def _check(status: int, path: str) -> None:
    if status in (200, 206):
        return
    if status in (401, 403):
        raise SourceFailed(FailureCode.SOURCE_UNAUTHORIZED, False, f"{path}: HTTP {status}")
    if status in (404, 410):
        raise SourceFailed(FailureCode.SOURCE_NOT_FOUND, False, f"{path}: HTTP {status}")
    if status == 416:
        # Asked beyond the end: the staged part is as long as (or longer than) the file.
        raise SourceFailed(FailureCode.SIZE_MISMATCH, True, f"{path}: range not satisfiable")
    raise SourceFailed(FailureCode.SOURCE_UNAVAILABLE, True, f"{path}: HTTP {status}")
