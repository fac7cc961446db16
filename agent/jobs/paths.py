"""Where an artifact job may write, decided on the node, whatever the lease says.

The control plane already refuses paths outside its narrow pattern; the node checks
again against its own filesystem, because only the node can see symlinks:

* the root must be one of the agent's configured `artifact_roots`;
* a file path is relative, `/`-separated, with no empty, `.` or `..` segment, no
  backslash and no control character, each segment a name the filesystem can hold
  (schemas/base.py: the wire's own rule, checked again here), and it must land inside
  `{root}/{repository}/{commit}/`; spaces, non-ASCII letters, `~` or parentheses are
  only characters of a name (nothing here goes through a shell);
* no existing component between the root and the file may be a symlink (a symlink
  planted inside the root could otherwise point a write anywhere).

The staging area lives inside the root (`{root}/.modelforge-staging/{job_id}/`), on the
same filesystem, so promotion is a rename.
"""

from __future__ import annotations

import os
import re
import stat
import uuid
from pathlib import Path

from agent.errors import AgentError
from schemas.base import FILE_PATH_PATTERN, MAX_SEGMENT_BYTES

STAGING_DIR = ".modelforge-staging"
_SEGMENT = re.compile(r"^[A-Za-z0-9_.+=@-]+$")
_FILE_PATH = re.compile(FILE_PATH_PATTERN)
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


class PathNotAllowed(AgentError):
    """A path the node refuses to write: the job fails `path_not_allowed`."""


def _segments(relative: str, what: str) -> list[str]:
    if not relative or relative.startswith("/") or "\x00" in relative:
        raise PathNotAllowed(f"{what} must be a relative path")
    parts = relative.split("/")
    for part in parts:
        if part in ("", ".", "..") or not _SEGMENT.match(part):
            raise PathNotAllowed(f"{what} has a segment that is not allowed")
    return parts


def allowed_root(root: str, configured: list[str]) -> Path:
    """The root as configured, if it is one of the agent's artifact roots."""
    if root not in configured:
        raise PathNotAllowed("the target root is not one of this agent's artifact_roots")
    path = Path(root)
    if not path.is_absolute():
        raise PathNotAllowed("the target root is not absolute")
    return path


def artifact_dir(root: Path, repository: str, commit: str) -> Path:
    """`{root}/{repository}/{commit}`: where a finished artifact lives."""
    if not _COMMIT.match(commit):
        raise PathNotAllowed("the commit is not a full commit id")
    return root.joinpath(*_segments(repository, "the repository"), commit)


def staging_dir(root: Path, job_id: uuid.UUID) -> Path:
    return root / STAGING_DIR / str(job_id)


def inside(base: Path, relative: str) -> Path:
    """`base / relative`, refused if it could land outside `base` or its name is not
    safe to create."""
    what = "the file path"
    if not _FILE_PATH.fullmatch(relative):
        raise PathNotAllowed(f"{what} is not a safe relative path")
    parts = relative.split("/")
    if any(part in (".", "..") for part in parts):  # the pattern says so too; cheap
        raise PathNotAllowed(f"{what} has a segment that is not allowed")
    try:
        too_long = any(len(part.encode()) > MAX_SEGMENT_BYTES for part in parts)
    except UnicodeEncodeError:  # a lone surrogate: no filesystem name
        raise PathNotAllowed(f"{what} is not valid Unicode") from None
    if too_long:
        raise PathNotAllowed(f"{what} has a segment longer than {MAX_SEGMENT_BYTES} bytes")
    return base.joinpath(*parts)


def no_symlinks_below(root: Path, target: Path) -> None:
    """Refuse when any existing component from `root` (exclusive) down to `target` is a
    symlink, or is not a directory where one is needed."""
    try:
        relative = target.relative_to(root)
    except ValueError:
        raise PathNotAllowed("the path is not under the target root") from None
    current = root
    parts = relative.parts
    for index, part in enumerate(parts):
        current = current / part
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            return  # nothing below a missing component can exist yet
        if stat.S_ISLNK(mode):
            raise PathNotAllowed("a component of the path is a symlink")
        last = index == len(parts) - 1
        if not last and not stat.S_ISDIR(mode):
            raise PathNotAllowed("a component of the path is not a directory")
