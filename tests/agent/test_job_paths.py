"""The node's own path rules for artifact jobs (agent/jobs/paths.py): whatever a lease
says, nothing is written outside `{root}/{repository}/{commit}/`, and no symlink inside
the root is followed. Pure functions on a real temporary directory; hypothesis draws
hostile paths."""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from agent.jobs.paths import (
    PathNotAllowed,
    allowed_root,
    artifact_dir,
    inside,
    no_symlinks_below,
    staging_dir,
)
from schemas.base import FILE_PATH_PATTERN, FilePath

pytestmark = pytest.mark.fast

COMMIT = "0123456789abcdef0123456789abcdef01234567"
# Names the Hub accepts and a filesystem holds: spaces, non-ASCII, `~`, parentheses.
SEGMENT = st.text(alphabet="abcXYZ019_.+=@-~() é日", min_size=1, max_size=8)
HOSTILE = st.sampled_from(
    ["..", ".", "", "/", "\x00", "a/../..", "../", "..\\x", "a\\b", "a\n", "\x7f", "\u202e"]
)
# A name longer than a filesystem holds (256 bytes in UTF-8).
HOSTILE = st.one_of(HOSTILE, st.just("é" * 128))
PATHS = st.lists(st.one_of(SEGMENT, HOSTILE), min_size=1, max_size=6).map("/".join)
PATHS = st.one_of(PATHS, PATHS.map(lambda p: "/" + p), st.text(max_size=30))
WIRE_PATH: TypeAdapter[str] = TypeAdapter(FilePath)


def on_the_wire(relative: str) -> bool:
    """Whether the control plane accepts the path (schemas/base.py: FilePath)."""
    try:
        WIRE_PATH.validate_python(relative)
    except ValidationError:
        return False
    return True


@settings(max_examples=500, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(relative=PATHS)
def test_an_accepted_path_is_always_inside_the_artifact(tmp_path: Path, relative: str) -> None:
    base = artifact_dir(tmp_path, "acme/model", COMMIT)
    try:
        target = inside(base, relative)
    except PathNotAllowed:
        return
    resolved = os.path.normpath(target)
    assert resolved.startswith(str(base) + os.sep)
    assert ".." not in Path(relative).parts
    # The node is never looser than the control plane's pattern.
    assert re.fullmatch(FILE_PATH_PATTERN, relative)
    assert on_the_wire(relative)


@given(relative=PATHS)
def test_the_node_accepts_whatever_the_control_plane_accepts(relative: str) -> None:
    if not on_the_wire(relative):
        return
    target = inside(Path("/srv/models/acme/m") / COMMIT, relative)
    assert str(target).endswith(relative)


def test_roots_must_be_configured(tmp_path: Path) -> None:
    assert allowed_root(str(tmp_path), [str(tmp_path)]) == tmp_path
    with pytest.raises(PathNotAllowed):
        allowed_root("/etc", [str(tmp_path)])
    with pytest.raises(PathNotAllowed):
        artifact_dir(tmp_path, "../escape", COMMIT)
    with pytest.raises(PathNotAllowed):
        artifact_dir(tmp_path, "acme/model", "main")
    assert staging_dir(tmp_path, uuid.UUID(int=1)).parent.parent == tmp_path


def test_a_symlink_inside_the_root_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "root"
    (root / "acme").mkdir(parents=True)
    (root / "acme" / "model").symlink_to(outside)
    target = inside(artifact_dir(root, "acme/model", COMMIT), "weights.gguf")
    with pytest.raises(PathNotAllowed):
        no_symlinks_below(root, target)
    # A plain tree passes, and a file where a directory is needed does not.
    plain = inside(artifact_dir(root, "acme/other", COMMIT), "sub/weights.gguf")
    no_symlinks_below(root, plain)
    (root / "acme" / "other").write_text("not a directory")
    with pytest.raises(PathNotAllowed):
        no_symlinks_below(root, plain)
    with pytest.raises(PathNotAllowed):
        no_symlinks_below(root, outside / "x")


def test_a_symlinked_file_is_refused(tmp_path: Path) -> None:
    base = artifact_dir(tmp_path, "acme/model", COMMIT)
    base.mkdir(parents=True)
    (base / "weights.gguf").symlink_to("/etc/passwd")
    with pytest.raises(PathNotAllowed):
        no_symlinks_below(tmp_path, inside(base, "weights.gguf"))


@pytest.mark.parametrize(
    "relative", ["my model (1).gguf", "ünïcödé~/weights v2.gguf", "日本語.json", "~", "a b/ c "]
)
def test_a_safe_odd_name_is_written_where_it_says(tmp_path: Path, relative: str) -> None:
    base = artifact_dir(tmp_path, "acme/model", COMMIT)
    target = inside(base, relative)
    no_symlinks_below(tmp_path, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(b"x")
    assert target.relative_to(base).as_posix() == relative
    assert on_the_wire(relative)
