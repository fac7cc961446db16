"""The agent's persisted state: identity, credential and stream cursors.

Layout of the state dir (0700; files 0600, each replaced atomically: a temporary file in
the same directory, fsync, rename, fsync of the directory):

    identity.json   node id, credential id and credential; written at enrollment and by
                    `modelforge agent install-credential`, never by the running agent
    cursors.json    per stream, the highest sequence number reserved so far
    agent.lock      held (flock) by the running agent: one agent per state dir

Sequence numbers are reserved in blocks and the block's end is persisted *before* any
number of it is used, so after a crash the agent resumes above everything it could have
sent: a sequence never goes backwards. A crash skips at most one block, which the
protocol allows (sequences must increase, not be contiguous).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import stat
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from agent.errors import StateError
from schemas.admin import CredentialRotated
from schemas.agent import SEQUENCE_MAX
from schemas.protocol import NODE_CREDENTIAL_PREFIX, StreamName, secret_pattern

logger = logging.getLogger("modelforge.agent.state")

IDENTITY_FILE = "identity.json"
CURSORS_FILE = "cursors.json"
LOCK_FILE = "agent.lock"
WRITE_LOCK_FILE = ".write.lock"
STREAMS: tuple[str, ...] = (StreamName.INVENTORY, StreamName.TELEMETRY)
FORMAT = 1
DIR_MODE = 0o700
FILE_MODE = 0o600
# The protocol's ceiling: the server refuses anything above it.
MAX_SEQUENCE = SEQUENCE_MAX
_CREDENTIAL = secret_pattern(NODE_CREDENTIAL_PREFIX)


@dataclass(frozen=True)
class Identity:
    node_id: uuid.UUID
    credential_id: uuid.UUID
    # Never in a repr, so never in a log line or a traceback by accident.
    credential: str = field(repr=False)
    enrolled_at: datetime
    api_url: str

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "node_id": str(self.node_id),
            "credential_id": str(self.credential_id),
            "credential": self.credential,
            "enrolled_at": self.enrolled_at.isoformat(),
            "api_url": self.api_url,
        }

    @classmethod
    def from_json(cls, data: Any) -> Identity:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError("unknown state format")
        return cls(
            node_id=uuid.UUID(str(data["node_id"])),
            credential_id=uuid.UUID(str(data["credential_id"])),
            credential=str(data["credential"]),
            enrolled_at=datetime.fromisoformat(str(data["enrolled_at"])),
            api_url=str(data["api_url"]),
        )


def atomic_write(path: Path, content: bytes, mode: int = FILE_MODE) -> None:
    """Replace path with content so that a crash leaves the old or the new file, whole."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _private(path: Path, mode: int) -> None:
    """Tighten path to mode if it is looser (a restored backup, a hand-made dir)."""
    current = stat.S_IMODE(path.stat().st_mode)
    if current & ~mode:
        logger.warning("%s had mode %o; tightened to %o", path, current, mode)
        path.chmod(mode)


class CursorFile:
    """Per stream, the highest sequence number reserved so far, in one JSON file replaced
    atomically: the agent's cursors.json, and the runtime worker's in its run dir (each
    process its own file, so neither overwrites the other's streams)."""

    def __init__(self, path: Path, streams: tuple[str, ...]) -> None:
        self.path = path
        self.streams = streams

    def load_cursors(self) -> dict[str, int]:
        try:
            data = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return dict.fromkeys(self.streams, 0)
        except (OSError, ValueError) as exc:
            raise StateError(f"{self.path} is unreadable ({type(exc).__name__})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise StateError(f"{self.path} has an unknown format")
        cursors = {}
        for stream in self.streams:
            value = data.get(stream, 0)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise StateError(f"{self.path}: bad cursor for {stream}")
            cursors[stream] = value
        return cursors

    def save_cursors(self, cursors: dict[str, int]) -> None:
        atomic_write(self.path, _dump({"format": FORMAT, **cursors}))


class StateDir:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock_fd: int | None = None
        self._cursors = CursorFile(self.cursors_path, STREAMS)

    @property
    def identity_path(self) -> Path:
        return self.path / IDENTITY_FILE

    @property
    def cursors_path(self) -> Path:
        return self.path / CURSORS_FILE

    def prepare(self) -> None:
        """Create the dir private, or tighten an existing one."""
        try:
            self.path.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
            _private(self.path, DIR_MODE)
            for name in (IDENTITY_FILE, CURSORS_FILE):
                if (self.path / name).exists():
                    _private(self.path / name, FILE_MODE)
        except OSError as exc:
            raise StateError(f"cannot prepare state dir {self.path}: {exc.strerror}") from None

    def acquire(self) -> None:
        """Hold the agent lock for the life of the process: one agent per state dir."""
        fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StateError(
                f"another agent is running with state dir {self.path}; two agents on one "
                "identity would interleave their sequence numbers"
            ) from None
        self._lock_fd = fd

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    @contextlib.contextmanager
    def _write_lock(self) -> Iterator[None]:
        fd = os.open(self.path / WRITE_LOCK_FILE, os.O_RDWR | os.O_CREAT, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _read_json(self, path: Path) -> Any:
        try:
            return json.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise StateError(
                f"{path} is unreadable ({type(exc).__name__}); restore it from a backup — "
                "the agent will not enroll again on its own"
            ) from None

    def load_identity(self) -> Identity | None:
        data = self._read_json(self.identity_path)
        if data is None:
            return None
        try:
            return Identity.from_json(data)
        except (KeyError, ValueError, TypeError):
            raise StateError(
                f"{self.identity_path} is not a valid identity; restore it from a backup — "
                "the agent will not enroll again on its own"
            ) from None

    def save_identity(self, identity: Identity) -> None:
        with self._write_lock():
            atomic_write(self.identity_path, _dump(identity.to_json()))

    def load_cursors(self) -> dict[str, int]:
        return self._cursors.load_cursors()

    def save_cursors(self, cursors: dict[str, int]) -> None:
        self._cursors.save_cursors(cursors)

    def install_credential(self, text: str) -> Identity:
        """Replace the credential of the enrolled identity (after a rotation).

        text: the credential itself, or the JSON answer of the rotate route, whose node_id
        must be this node's.
        """
        if not self.identity_path.is_file():
            raise StateError(
                f"{self.path} holds no identity: a credential can only be installed for "
                "an enrolled node (enroll with a token first)"
            )
        with self._write_lock():
            current = self.load_identity()
            if current is None:
                raise StateError(
                    f"{self.path} holds no identity: a credential can only be installed for "
                    "an enrolled node (enroll with a token first)"
                )
            credential, claimed_node = _parse_credential(text.strip())
            if claimed_node is not None and claimed_node != current.node_id:
                raise StateError(
                    f"that credential was issued for node {claimed_node}, but this state dir "
                    f"is node {current.node_id}; nothing was changed"
                )
            match = _CREDENTIAL.match(credential)
            assert match is not None
            replaced = Identity(
                node_id=current.node_id,
                credential_id=uuid.UUID(hex=match.group(1)),
                credential=credential,
                enrolled_at=current.enrolled_at,
                api_url=current.api_url,
            )
            atomic_write(self.identity_path, _dump(replaced.to_json()))
            return replaced


def _parse_credential(text: str) -> tuple[str, uuid.UUID | None]:
    if text.startswith("{"):
        try:
            rotated = CredentialRotated.model_validate_json(text)
        except ValidationError:
            raise StateError(
                "the input is JSON but not the answer of .../credential/rotate"
            ) from None
        credential, node_id = rotated.credential, rotated.node_id
    else:
        credential, node_id = text, None
    if not _CREDENTIAL.match(credential):
        raise StateError("the input is not a node credential (mfn.<id>.<secret>)")
    return credential, node_id


def _dump(data: dict[str, Any]) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


class CursorStore(Protocol):
    """Where a node's process keeps its streams' reserved marks (StateDir, CursorFile)."""

    def load_cursors(self) -> dict[str, int]: ...
    def save_cursors(self, cursors: dict[str, int]) -> None: ...


class Sequences:
    """Per-stream sequence numbers that never go backwards, across crashes too: the
    agent's streams (its state dir) and the runtime worker's report (its run dir).

    With a store, the end of each reserved block is persisted before the block is
    used. Without one (the fleet simulator), numbers live in memory only.
    """

    def __init__(
        self,
        state: CursorStore | None = None,
        *,
        block: int = 64,
        streams: tuple[str, ...] = STREAMS,
    ) -> None:
        self._state = state
        self._block = block
        self._reserved = state.load_cursors() if state else dict.fromkeys(streams, 0)
        # Start above everything a previous run may have used.
        self._next = {stream: mark + 1 for stream, mark in self._reserved.items()}

    def peek(self, stream: str) -> int:
        return self._next[stream]

    def take(self, stream: str) -> int:
        number = self._next[stream]
        if number > MAX_SEQUENCE:
            raise StateError(f"{stream} sequence exhausted")
        if number > self._reserved[stream]:
            self._reserve(stream, min(number + self._block - 1, MAX_SEQUENCE))
        self._next[stream] = number + 1
        return number

    def advance_past(self, stream: str, cursor: int) -> None:
        """The server has seen up to cursor (e.g. after a state restore): jump past it."""
        if cursor >= self._next[stream]:
            self._next[stream] = cursor + 1
            if cursor > self._reserved[stream]:
                self._reserve(stream, cursor)

    def _reserve(self, stream: str, mark: int) -> None:
        reserved = {**self._reserved, stream: mark}
        if self._state is not None:
            self._state.save_cursors(reserved)
        self._reserved = reserved


def utcnow() -> datetime:
    return datetime.now(UTC)
