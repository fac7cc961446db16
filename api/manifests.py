"""Server-resolved manifests: a repository, a revision and file patterns become an exact
commit and each file's size and digest, from the source's Hub-layout API:

* `GET {endpoint}/api/models/{repo}/revision/{revision}` → `sha`, the exact commit;
* `GET {endpoint}/api/models/{repo}/tree/{commit}?recursive=true` → files: an LFS file
  carries `lfs.oid` (sha256) and `lfs.size`; a small one its git blob id (`oid`) and
  `size`.

Only the exact values are stored on the job; the node verifies whichever digest kind it
holds. The operator's mistakes (no such repository, revision or matching file) are 422;
a source that cannot be reached is 503.
"""

from __future__ import annotations

import fnmatch
import logging
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import ValidationError

from api.errors import ApiError, ServiceUnavailable
from schemas.artifacts import (
    MAX_FILES,
    ArtifactFile,
    ArtifactManifest,
    DigestAlgorithm,
    GitBlobDigest,
    ManifestRequest,
    Sha256Digest,
)
from schemas.errors import ErrorCode

logger = logging.getLogger("modelforge.api.manifests")


class Unresolvable(ApiError):
    status_code = 422
    default_code = ErrorCode.MANIFEST_UNRESOLVED


class ManifestResolver:
    def __init__(self, endpoint: str, token: str | None, timeout_s: float = 10.0) -> None:
        self._endpoint = endpoint.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(timeout=timeout_s, headers=headers, trust_env=False)

    async def close(self) -> None:
        await self._http.aclose()

    async def _get(self, path: str, what: str, **params: str) -> Any:
        url = f"{self._endpoint}{path}"
        try:
            response = await self._http.get(url, params=params or None)
        except httpx.HTTPError as exc:
            logger.warning("artifact source unreachable (%s)", type(exc).__name__)
            raise ServiceUnavailable(
                "the artifact source cannot be reached; retry shortly",
                code=ErrorCode.SOURCE_UNAVAILABLE,
            ) from None
        if response.status_code in (401, 403):
            raise Unresolvable(
                f"the artifact source refused access to the {what}",
                extra={"source_status": response.status_code},
            )
        if response.status_code == 404:
            raise Unresolvable(f"the artifact source has no such {what}")
        if response.status_code != 200:
            raise ServiceUnavailable(
                f"the artifact source answered {response.status_code}",
                code=ErrorCode.SOURCE_UNAVAILABLE,
            )
        try:
            return response.json()
        except ValueError:
            raise ServiceUnavailable(
                "the artifact source answered something that is not JSON",
                code=ErrorCode.SOURCE_UNAVAILABLE,
            ) from None

    async def resolve(self, request: ManifestRequest) -> ArtifactManifest:
        repo = quote(request.repository, safe="/")
        revision = await self._get(
            f"/api/models/{repo}/revision/{quote(request.revision, safe='')}", "revision"
        )
        commit = revision.get("sha") if isinstance(revision, dict) else None
        tree = await self._get(
            f"/api/models/{repo}/tree/{quote(str(commit), safe='')}", "tree", recursive="true"
        )
        if not isinstance(tree, list):
            raise Unresolvable("the artifact source's file tree is not a list")
        files = [
            entry
            for entry in (_file(item) for item in tree)
            if entry is not None and _selected(entry.path, request.patterns)
        ]
        if not files:
            raise Unresolvable("no file of that revision matches the patterns")
        if len(files) > MAX_FILES:
            raise Unresolvable(f"more than {MAX_FILES} files match the patterns")
        try:
            return ArtifactManifest(
                repository=request.repository, commit=commit, files=sorted(files, key=_path)
            )
        except ValidationError:
            raise Unresolvable(
                "the artifact source answered a commit or file list ModelForge cannot store"
            ) from None


def _path(entry: ArtifactFile) -> str:
    return entry.path


def _selected(path: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns)


def _file(item: object) -> ArtifactFile | None:
    """A tree entry as a file with its digest; None for directories and for anything
    malformed (its path or digest would not validate: it is never selected)."""
    if not isinstance(item, dict) or item.get("type") != "file":
        return None
    lfs = item.get("lfs")
    try:
        if isinstance(lfs, dict):
            digest: Sha256Digest | GitBlobDigest = Sha256Digest(
                algorithm=DigestAlgorithm.SHA256, value=str(lfs.get("oid"))
            )
            size = lfs.get("size")
        else:
            digest = GitBlobDigest(algorithm=DigestAlgorithm.GIT_SHA1, value=str(item.get("oid")))
            size = item.get("size")
        return ArtifactFile(path=item.get("path"), size=size, digest=digest)
    except ValidationError:
        return None
