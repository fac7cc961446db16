"""Server-resolved manifests: a repository, a revision and file patterns become an exact
commit and each file's size and digest, from the source's Hub-layout API:

* `GET {endpoint}/api/models/{repo}/revision/{revision}` → `sha`, the exact commit;
* `GET {endpoint}/api/models/{repo}/tree/{commit}?recursive=true` → files: an LFS file
  carries `lfs.oid` (sha256) and `lfs.size`; a small one its git blob id (`oid`) and
  `size`.

Only the exact values are stored on the job; the node verifies whichever digest kind it
holds. Every answer goes through the bounded reader (schemas/bounded.py: size, depth,
schemas/hub.py), so a hostile or broken source costs bounded memory and time.

* The operator's mistakes (no such repository, revision or matching file) are 422.
* A selected file the job cannot hold (its path, size or digest does not fit the wire)
  refuses the create with 422 naming the files: a job never silently leaves one out.
* A source that answers what we do not read is 502; one that cannot be reached, or
  takes longer than `answer_timeout_s` for one whole answer (a trickle), is 503.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import re
from typing import Final, TypeVar
from urllib.parse import quote

import httpx
from pydantic import TypeAdapter, ValidationError

from api.errors import ApiError, BadGateway, ServiceUnavailable
from schemas.artifacts import (
    MAX_FILES,
    ArtifactFile,
    ArtifactManifest,
    DigestAlgorithm,
    GitBlobDigest,
    ManifestRequest,
    Sha256Digest,
)
from schemas.bounded import Unreadable, read_json
from schemas.errors import ErrorCode
from schemas.hub import (
    MAX_ANSWER_BYTES,
    MAX_TREE_PAGES,
    REVISION,
    SOURCE_URL_ENV,
    TREE,
    TreeEntry,
    source_shown,
)

T = TypeVar("T")

# A refusal names at most this many files, each cut to this many characters.
NAMED_FILES: Final = 20
NAME_CHARS: Final = 300
_COMMIT = re.compile(r"^[0-9a-f]{40}$")

logger = logging.getLogger("modelforge.api.manifests")


class Unresolvable(ApiError):
    status_code = 422
    default_code = ErrorCode.MANIFEST_UNRESOLVED


class ManifestResolver:
    def __init__(
        self,
        endpoint: str,
        token: str | None,
        timeout_s: float = 10.0,
        answer_timeout_s: float = 30.0,
    ) -> None:
        self._endpoint = endpoint.rstrip("/")
        # httpx's timeout bounds each socket operation, not an answer: a source that
        # trickles a byte inside it each time would hold a create for as long as it
        # liked. Each whole answer (at most MAX_ANSWER_BYTES) gets this long.
        self._answer_timeout_s = answer_timeout_s
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(timeout=timeout_s, headers=headers, trust_env=False)

    async def close(self) -> None:
        await self._http.aclose()

    async def _get(self, path: str, what: str, schema: TypeAdapter[T], **params: str) -> T:
        value, _ = await self._page(f"{self._endpoint}{path}", what, schema, **params)
        return value

    async def _page(
        self, url: str, what: str, schema: TypeAdapter[T], **params: str
    ) -> tuple[T, str | None]:
        """One answer, and the URL of its next page (the Hub paginates long lists with
        `Link: <…>; rel="next"`), if any."""
        try:
            async with (
                asyncio.timeout(self._answer_timeout_s),
                self._http.stream("GET", url, params=params or None) as response,
            ):
                self._check(response.status_code, what)
                value = await read_json(
                    response.aiter_bytes(),
                    schema,
                    max_bytes=MAX_ANSWER_BYTES,
                    declared=response.headers.get("content-length"),
                )
                following = response.links.get("next", {}).get("url")
        except TimeoutError:
            logger.warning("artifact source's %s answer slower than %s s", what,
                           self._answer_timeout_s)  # fmt: skip
            raise self._unavailable(
                f"took longer than {self._answer_timeout_s:g} s for its {what} answer"
            ) from None
        except httpx.HTTPError as exc:
            logger.warning("artifact source unreachable (%s)", type(exc).__name__)
            raise self._unavailable(f"cannot be reached ({type(exc).__name__})") from None
        except Unreadable as exc:
            logger.warning("artifact source's %s answer refused: %s", what, exc.reason)
            raise BadGateway(
                f"the artifact source's {what} answer cannot be read: {exc.reason}"
            ) from None
        # Only pages of the same source: the token goes with every request.
        if following is not None and not following.startswith(f"{self._endpoint}/"):
            raise BadGateway(f"the artifact source's {what} answer links outside the source")
        return value, following

    def _unavailable(self, why: str) -> ServiceUnavailable:
        """503 source_unavailable naming the source and the setting that chose it: the
        usual cause is an offline host still pointed at the Hub, which no retry mends."""
        return ServiceUnavailable(
            f"the artifact source {source_shown(self._endpoint)} {why}; the control plane"
            f" resolves from {SOURCE_URL_ENV} (set for `modelforge up` or `modelforge api`:"
            " offline, a mirror with the Hub layout)",
            code=ErrorCode.SOURCE_UNAVAILABLE,
        )

    def _check(self, status: int, what: str) -> None:
        if status in (401, 403):
            raise Unresolvable(
                f"the artifact source refused access to the {what}",
                extra={"source_status": status},
            )
        if status == 404:
            raise Unresolvable(f"the artifact source has no such {what}")
        if status != 200:
            raise self._unavailable(f"answered {status} for the {what}")

    async def _tree(self, repo: str, commit: str) -> list[TreeEntry]:
        """Every entry of the commit's tree, page after page: a file on a later page is
        never left out silently."""
        url: str | None = f"{self._endpoint}/api/models/{repo}/tree/{commit}"
        params = {"recursive": "true"}
        entries: list[TreeEntry] = []
        for _ in range(MAX_TREE_PAGES):
            if url is None:
                return entries
            page, url = await self._page(url, "tree", TREE, **params)
            entries += page
            params = {}  # a next page's URL carries its own query
        if url is None:
            return entries
        raise BadGateway(f"the artifact source's tree has more than {MAX_TREE_PAGES} pages")

    async def resolve(self, request: ManifestRequest) -> ArtifactManifest:
        repo = quote(request.repository, safe="/")
        revision = await self._get(
            f"/api/models/{repo}/revision/{quote(request.revision, safe='')}", "revision", REVISION
        )
        commit = revision.sha
        if not _COMMIT.match(commit):
            raise BadGateway("the artifact source answered a revision that is not a commit id")
        tree = await self._tree(repo, commit)
        selected = [
            entry
            for entry in tree
            if entry.type == "file" and _selected(entry.path, request.patterns)
        ]
        if not selected:
            raise Unresolvable("no file of that revision matches the patterns")
        if len(selected) > MAX_FILES:
            raise Unresolvable(f"more than {MAX_FILES} files match the patterns")
        files: list[ArtifactFile] = []
        unfit: list[str] = []
        for entry in selected:
            file = _file(entry)
            if file is None:
                unfit.append(entry.path)
            else:
                files.append(file)
        if unfit:
            raise Unresolvable(
                f"{len(unfit)} selected file(s) cannot be part of a job (a path that is not a"
                " safe relative path, or a size or digest out of range); narrow the patterns",
                extra={"files": [name[:NAME_CHARS] for name in sorted(unfit)[:NAMED_FILES]]},
            )
        try:
            return ArtifactManifest(
                repository=request.repository, commit=commit, files=sorted(files, key=_path)
            )
        except ValidationError:  # e.g. a path listed twice
            raise BadGateway(
                "the artifact source answered a file list with repeated paths"
            ) from None


def _path(entry: ArtifactFile) -> str:
    return entry.path


def _selected(path: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns)


def _file(entry: TreeEntry) -> ArtifactFile | None:
    """A selected tree entry as a file with its digest; None when the job could not hold
    it (the caller names it in the refusal)."""
    try:
        if entry.lfs is not None:
            digest: Sha256Digest | GitBlobDigest = Sha256Digest(
                algorithm=DigestAlgorithm.SHA256, value=entry.lfs.oid
            )
            size: int | None = entry.lfs.size
        else:
            digest = GitBlobDigest(algorithm=DigestAlgorithm.GIT_SHA1, value=str(entry.oid))
            size = entry.size
        if size is None:
            return None
        return ArtifactFile(path=entry.path, size=size, digest=digest)
    except ValidationError:
        return None
