"""A file a runtime lease names is loaded only if it is a plain, regular file, inside the
runtime worker's artifact roots when it has any (agent/runtime/admission.py: model_file)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.runtime.admission import model_file
from agent.runtime.jobs import RuntimeFailed

pytestmark = pytest.mark.fast


def test_a_regular_file_inside_a_root_is_taken(tmp_path: Path) -> None:
    root = tmp_path / "models"
    (root / "acme").mkdir(parents=True)
    (root / "acme" / "m.gguf").write_bytes(b"gguf")
    assert model_file(str(root / "acme" / "m.gguf"), [root]) == root / "acme" / "m.gguf"


def test_without_artifact_roots_nothing_is_loaded(tmp_path: Path) -> None:
    (tmp_path / "m.gguf").write_bytes(b"gguf")
    with pytest.raises(RuntimeFailed) as refused:
        model_file(str(tmp_path / "m.gguf"), [])
    assert "no artifact_roots" in refused.value.detail


@pytest.mark.parametrize("case", ["relative", "dotdot", "link", "directory", "fifo", "outside",
                                  "missing"])  # fmt: skip
def test_anything_else_is_refused(tmp_path: Path, case: str) -> None:
    root = tmp_path / "models"
    root.mkdir()
    secret = tmp_path / "secret"
    secret.write_bytes(b"not a model")
    named = {
        "relative": "models/m.gguf",
        "dotdot": f"{root}/../secret",
        "link": f"{root}/link.gguf",
        "directory": str(root),
        "fifo": f"{root}/fifo.gguf",
        "outside": str(secret),
        "missing": f"{root}/absent.gguf",
    }[case]
    (root / "link.gguf").symlink_to(secret)
    os.mkfifo(root / "fifo.gguf")
    with pytest.raises(RuntimeFailed) as refused:
        model_file(named, [root])
    assert refused.value.code == "artifact_missing"
