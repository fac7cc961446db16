"""A Hugging Face Hub-layout source: `{endpoint}/{repository}/resolve/{commit}/{path}`,
with HTTP Range for resumes; the Hub itself or any mirror that speaks the layout.

Streamed with httpx rather than `huggingface_hub`: the job needs a resume from an exact
offset into a staging file we name, a digest computed while streaming (of whichever
kind the job holds, git blob ids included), a per-chunk stall timeout and a reserve
check during the download, and `hf_hub_download` owns its cache layout, its own
verification and its retries. A thin client over httpx keeps each of those rules ours.
The token (optional) is sent only to the configured endpoint.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from urllib.parse import quote

import httpx

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


class HubSource:
    def __init__(self, endpoint: str, token: str | None, http: httpx.AsyncClient) -> None:
        self.endpoint = endpoint.rstrip("/")
        self._token = token
        self._http = http

    def url(self, repository: str, commit: str, path: str) -> str:
        return (
            f"{self.endpoint}/{quote(repository, safe='/')}/resolve/{commit}/"
            f"{quote(path, safe='/')}"
        )

    @asynccontextmanager
    async def open(
        self, repository: str, commit: str, path: str, offset: int
    ) -> AsyncIterator[Download]:
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        try:
            async with self._http.stream(
                "GET", self.url(repository, commit, path), headers=headers
            ) as response:
                _check(response.status_code, path)
                start = offset if response.status_code == 206 else 0
                # As the bytes arrive: a chunk size would hold them back until a whole
                # chunk is in, and a slow source would look stalled.
                yield Download(start, response.aiter_raw())
        except httpx.TimeoutException:
            raise SourceFailed(FailureCode.STALLED, True, f"{path}: no data in time") from None
        except httpx.TransportError as exc:
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
