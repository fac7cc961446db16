"""ops/bench/hop_trace.patch is applied by hand to trace a gateway request's hops
(ops/bench/hop_trace.py). It touches the gateway's and the runtime worker's hot paths,
so a change there can leave it behind: this says so the day it happens, not the day
someone needs the trace."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATCH = ROOT / "ops" / "bench" / "hop_trace.patch"


@pytest.mark.fast
def test_the_hop_trace_patch_still_applies() -> None:
    git = shutil.which("git")
    assert git is not None, "git is needed to check ops/bench/hop_trace.patch"
    # --check only: nothing in the tree changes.
    checked = subprocess.run(
        [git, "apply", "--check", str(PATCH)], cwd=ROOT, capture_output=True, text=True
    )
    assert checked.returncode == 0, (
        "ops/bench/hop_trace.patch no longer applies: apply what still does, put the "
        f"trace lines back by hand and save `git diff` over it\n{checked.stderr}"
    )
