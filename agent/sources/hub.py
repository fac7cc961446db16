"""A Hugging Face Hub-layout source: `{endpoint}/{repository}/resolve/{commit}/{path}`,
with HTTP Range for resumes; the Hub itself or any mirror that speaks the layout.

Streamed with aiohttp rather than `huggingface_hub` or httpx:
* `hf_hub_download` owns its cache layout, its verification and its retries, while the
  job needs a resume from an exact offset into a staging file we name, a digest of
  whichever kind the job holds (git blob ids included) computed while streaming, a
  stall rule and a reserve check during the download.
* httpx's async client reads about 200 MiB/s on loopback where curl reads 900
  (ops/bench/jobs.py); aiohttp's C parser and whole-buffer reads reach 500-700, and its
  `sock_read` timeout is the stall rule exactly: no byte for N seconds.
Redirects are followed (the Hub sends LFS files to a CDN); aiohttp drops the
Authorization header on a redirect to another origin, so the token (optional) goes
only to the configured endpoint. Bodies are taken as sent (no decompression), since the
digest is of the file's bytes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from urllib.parse import quote

import aiohttp

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


def source_session(
    *, stall_s: float, connect_timeout_s: float, trust_env: bool
) -> aiohttp.ClientSession:
    """The HTTP session a HubSource downloads with (the caller closes it)."""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s, sock_read=stall_s)
    return aiohttp.ClientSession(timeout=timeout, trust_env=trust_env, auto_decompress=False)


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
        headers = {"Accept-Encoding": "identity"}
        if offset:
            headers["Range"] = f"bytes={offset}-"
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        stall_s = self._session.timeout.sock_read
        try:
            async with self._session.get(
                self.url(repository, commit, path), headers=headers
            ) as response:
                _check(response.status, path)
                start = offset if response.status == 206 else 0
                # As the bytes arrive: whatever is buffered, never held back for a size.
                yield Download(start, response.content.iter_any())
        except TimeoutError:
            raise SourceFailed(
                FailureCode.STALLED, True, f"{path}: no data for {stall_s:g} s"
            ) from None
        except aiohttp.ClientError as exc:
            raise SourceFailed(
                FailureCode.SOURCE_UNAVAILABLE, True, f"{path}: {type(exc).__name__}"
            ) from None


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
