"""The files of an artifact job on disk: digests, the staged part of each file, and
promotion into place. Blocking calls only; the job runs them in a worker thread."""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from schemas.artifacts import ArtifactFile, DigestAlgorithm, FileDigest

# writev takes at most this many buffers per call (Linux: 1024; POSIX: at least 16).
_IOV_MAX = max(16, os.sysconf("SC_IOV_MAX"))


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
        self._offset = 0
        self._fd: int | None = None

    def resume(self) -> int:
        """Bytes already staged (at most the file's size), with the digest over them."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.hasher = new_digest(self.file.digest, self.file.size)
        try:
            have = min(self.path.stat().st_size, self.file.size)
        except FileNotFoundError:
            if self.file.size == 0:
                self.path.touch()  # an empty file is staged in full: nothing to fetch
            return 0
        with os.fdopen(os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as handle:
            remaining = have
            while remaining and (block := handle.read(min(remaining, 1 << 20))):
                self.hasher.update(block)
                remaining -= len(block)
        return have

    def begin(self, offset: int) -> None:
        """Write from `offset` on (0: the source sent the whole file, so start over).
        No I/O here: the first write opens the file, in the writing thread."""
        if offset == 0:
            self.hasher = new_digest(self.file.digest, self.file.size)
        self._offset = offset

    def _open(self) -> int:
        offset = self._offset
        if offset == 0:
            # A new file rather than the old one truncated to nothing: ext4 flushes a
            # file truncated to zero when it is closed (its guard for rewrite-in-place),
            # and the next metadata change then waits for that flush: 3-18 ms per file,
            # each time on the way to the rename.
            self.path.unlink(missing_ok=True)
        # paths.py checked the components for symlinks; NOFOLLOW keeps one planted in
        # the staged file's place since from being written through.
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        try:
            if os.fstat(fd).st_size != offset:
                os.ftruncate(fd, offset)  # what follows the offset is not ours any more
            os.lseek(fd, offset, os.SEEK_SET)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return fd

    def write(self, block: Sequence[bytes]) -> None:
        """The block's chunks in one writev (not copied into one buffer first), a short
        write carried on from where it stopped."""
        fd = self._fd if self._fd is not None else self._open()
        pending: list[bytes | memoryview] = [chunk for chunk in block if chunk]
        while pending:
            written = os.writev(fd, pending[:_IOV_MAX])
            if written <= 0:
                raise OSError(errno.EIO, "the staged file took no bytes")
            done = 0
            while done < len(pending) and written >= len(pending[done]):
                written -= len(pending[done])
                done += 1
            del pending[:done]
            if written:
                pending[0] = memoryview(pending[0])[written:]

    def digest(self, block: Sequence[bytes]) -> None:
        for chunk in block:
            self.hasher.update(chunk)

    def verified(self) -> bool:
        return self.hasher.hexdigest() == self.file.digest.value

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def discard(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)
