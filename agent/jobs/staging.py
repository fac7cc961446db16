"""The files of an artifact job on disk: digests, the staged part of each file, and
promotion into place. Blocking calls only; the job runs them in a worker thread."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import BinaryIO

from schemas.artifacts import ArtifactFile, DigestAlgorithm, FileDigest


def new_digest(digest: FileDigest, size: int) -> hashlib._Hash:
    if digest.algorithm == DigestAlgorithm.SHA256:
        return hashlib.sha256()
    blob = hashlib.sha1(usedforsecurity=False)
    blob.update(b"blob %d\0" % size)
    return blob


def hash_file(path: Path, digest: FileDigest, size: int, chunk: int) -> str:
    hasher = new_digest(digest, size)
    with path.open("rb") as handle:
        while block := handle.read(chunk):
            hasher.update(block)
    return hasher.hexdigest()


def present(target: Path, file: ArtifactFile, chunk: int) -> bool:
    """Already promoted, with the right size and digest (then it is not fetched again)."""
    if not target.is_file() or target.stat().st_size != file.size:
        return False
    return hash_file(target, file.digest, file.size, chunk) == file.digest.value


def promote(moves: list[tuple[Path, Path]]) -> None:
    for target, staged in moves:
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staged, target)


class Staged:
    """A file's staged part: resumed from what is on disk, then appended to block by
    block, each block also fed to the digest (verification costs no second read)."""

    def __init__(self, path: Path, file: ArtifactFile) -> None:
        self.path = path
        self.file = file
        self.hasher = new_digest(file.digest, file.size)
        self._out: BinaryIO | None = None

    def resume(self) -> int:
        """Bytes already staged (at most the file's size), with the digest over them."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.hasher = new_digest(self.file.digest, self.file.size)
        try:
            have = min(self.path.stat().st_size, self.file.size)
        except FileNotFoundError:
            return 0
        with self.path.open("rb") as handle:
            remaining = have
            while remaining and (block := handle.read(min(remaining, 1 << 20))):
                self.hasher.update(block)
                remaining -= len(block)
        return have

    def begin(self, offset: int) -> None:
        """Write from `offset` on (0: the source sent the whole file, so start over)."""
        if offset == 0:
            self.hasher = new_digest(self.file.digest, self.file.size)
        self._out = self.path.open("r+b" if self.path.exists() else "wb")
        self._out.seek(offset)
        self._out.truncate()

    def write(self, block: list[bytes]) -> None:
        assert self._out is not None
        self._out.writelines(block)

    def digest(self, block: list[bytes]) -> None:
        for chunk in block:
            self.hasher.update(chunk)

    def verified(self) -> bool:
        return self.hasher.hexdigest() == self.file.digest.value

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None

    def discard(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)
