"""What `modelforge up` tells its clients: the stack file in its data dir.

`up` writes `<data dir>/stack.json` once the stack answers and removes it when it stops.
`modelforge events tail`, `modelforge simulate` and `ops/examples/` read it, so they reach
the servers `up` started rather than whatever listens on a default port (often someone
else's NATS on 4222). The file holds no secret: the operator key stays in its own
0600 file, named here.

Beside it, `supervisor.json` says which of up's children its supervisor reports failing
(a crash loop of one the API can do without), for the API's `/readyz`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Final

from schemas.base import WireModel
from schemas.health import FailingChild

DEFAULT_DATA_DIR: Final = Path(".modelforge")
DATA_DIR_ENV: Final = "MODELFORGE_DATA_DIR"
STACK_FILE: Final = "stack.json"
# Where `up` keeps a generated operator key, in its data dir (0600); the admin CLI reads it.
OPERATOR_KEY_FILE: Final = "operator_api_key"


class StackInfo(WireModel):
    api_url: str
    nats_url: str
    # None when the key came from MODELFORGE_OPERATOR_API_KEY rather than a file.
    operator_key_file: str | None
    # The worker's Prometheus endpoint; None when MODELFORGE_METRICS_PORT=0.
    worker_metrics_url: str | None = None
    data_dir: str
    pid: int
    # The database the stack runs on (postgresql+asyncpg://...), for a second API or a
    # worker beside it; a password in it is shown as ***. None: an older `up` wrote it.
    database_url: str | None = None
    # Where the control plane resolves artifacts (the Hub or a mirror), for the agents
    # that download what it resolved.
    artifact_source_url: str | None = None


# `up`'s supervisor state, in its data dir, rewritten whenever a child starts or stops
# failing; the API reads it for `/readyz` from the path up passes in this variable.
SUPERVISOR_STATE_FILE: Final = "supervisor.json"
SUPERVISOR_STATE_ENV: Final = "MODELFORGE_SUPERVISOR_STATE_FILE"


class SupervisorState(WireModel):
    # The children that crash-looped, are retried, and have not stayed up since.
    failing: list[FailingChild]


def write_supervisor_state(path: Path, state: SupervisorState) -> None:
    """Atomically, so a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(state.model_dump_json(indent=2) + "\n")
    tmp.replace(path)


def read_supervisor_state(path: Path) -> SupervisorState | None:
    """None when there is no usable file (no `up`, or not yet written)."""
    try:
        return SupervisorState.model_validate_json(path.read_bytes())
    except (OSError, ValueError):
        return None


class StackFileError(Exception):
    """No usable stack file; the message says what to do instead."""


def data_dir() -> Path:
    return Path(os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR)


def stack_file(directory: Path | None = None) -> Path:
    return (directory or data_dir()) / STACK_FILE


def read_stack_info(directory: Path | None = None) -> StackInfo:
    path = stack_file(directory)
    try:
        info = StackInfo.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        raise StackFileError(
            f"no {path}: `modelforge up` writes it while it runs (is it running, from this "
            f"directory, or with another {DATA_DIR_ENV}?)"
        ) from None
    except (OSError, ValueError) as exc:
        raise StackFileError(f"{path} is unreadable ({type(exc).__name__})") from None
    if not _running(info.pid):
        # Left behind by an `up` that was killed: its servers are gone too.
        raise StackFileError(f"{path} is stale: `modelforge up` (pid {info.pid}) is not running")
    return info


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def write_stack_info(info: StackInfo) -> Path:
    """Atomically, so a reader never sees half a file."""
    path = stack_file(Path(info.data_dir))
    tmp = path.with_name(f".{STACK_FILE}.tmp")
    tmp.write_text(json.dumps(info.model_dump(), indent=2) + "\n")
    tmp.replace(path)
    return path


def operator_key_from(info: StackInfo) -> str:
    if info.operator_key_file is None:
        raise StackFileError(
            "the running stack takes its operator key from MODELFORGE_OPERATOR_API_KEY; "
            "set it here too"
        )
    try:
        return Path(info.operator_key_file).read_text().strip()
    except OSError as exc:
        raise StackFileError(
            f"cannot read the operator key file {info.operator_key_file} ({exc.strerror})"
        ) from None
