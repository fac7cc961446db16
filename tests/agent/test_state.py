"""The state dir: private, atomic, never re-enrolling silently, sequences never backwards."""

from __future__ import annotations

import json
import os
import stat
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.errors import StateError
from agent.state import Identity, Sequences, StateDir, atomic_write

pytestmark = pytest.mark.fast

CREDENTIAL = f"mfn.{uuid.uuid4().hex}.canary-credential-secret-0123456789abcdefgh"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def enrolled(path: Path) -> tuple[StateDir, Identity]:
    state = StateDir(path)
    state.prepare()
    identity = Identity(
        node_id=uuid.uuid4(),
        credential_id=uuid.UUID(hex=CREDENTIAL.split(".")[1]),
        credential=CREDENTIAL,
        enrolled_at=datetime.now(UTC),
        api_url="https://api.internal",
    )
    state.save_identity(identity)
    return state, identity


def test_prepare_makes_the_dir_private_and_tightens_loose_modes(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "a" / "state")
    state.prepare()
    assert mode(state.path) == 0o700
    state.path.chmod(0o755)
    (state.path / "identity.json").write_text("{}")
    (state.path / "identity.json").chmod(0o644)
    state.prepare()
    assert mode(state.path) == 0o700
    assert mode(state.path / "identity.json") == 0o600


def test_identity_round_trips_atomically_and_never_shows_the_credential(tmp_path: Path) -> None:
    state, identity = enrolled(tmp_path / "state")
    assert mode(state.identity_path) == 0o600
    assert state.load_identity() == identity
    assert CREDENTIAL not in repr(identity) and CREDENTIAL not in str(identity)
    leftovers = [p.name for p in state.path.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


def test_atomic_write_leaves_the_old_file_when_writing_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "f.json"
    atomic_write(target, b"old")

    def broken_fsync(fd: int) -> None:
        raise OSError(5, "I/O error")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError):
        atomic_write(target, b"new")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]


def test_a_damaged_identity_is_an_error_not_a_reason_to_enroll_again(tmp_path: Path) -> None:
    state, _ = enrolled(tmp_path / "state")
    state.identity_path.write_text("{not json")
    with pytest.raises(StateError, match="will not enroll again"):
        state.load_identity()
    state.identity_path.write_text(json.dumps({"format": 1, "node_id": "x"}))
    with pytest.raises(StateError, match="not a valid identity"):
        state.load_identity()
    assert StateDir(tmp_path / "fresh").load_identity() is None


def test_one_agent_per_state_dir(tmp_path: Path) -> None:
    first, second = StateDir(tmp_path), StateDir(tmp_path)
    first.acquire()
    try:
        with pytest.raises(StateError, match="another agent is running"):
            second.acquire()
    finally:
        first.release()
    second.acquire()
    second.release()


def test_sequences_reserve_before_use(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    state.prepare()
    sequences = Sequences(state, block=4)
    assert [sequences.take("telemetry") for _ in range(5)] == [1, 2, 3, 4, 5]
    # Everything handed out is at or below the persisted mark, before it is used.
    assert state.load_cursors()["telemetry"] >= 5
    assert mode(state.cursors_path) == 0o600
    restarted = Sequences(state, block=4)
    assert restarted.take("telemetry") > 5
    assert restarted.take("inventory") == 1


def test_advance_past_a_server_cursor_is_persisted(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    state.prepare()
    sequences = Sequences(state, block=2)
    sequences.take("inventory")
    sequences.advance_past("inventory", 1000)
    assert sequences.peek("inventory") == 1001
    assert Sequences(state, block=2).take("inventory") > 1000
    sequences.advance_past("inventory", 5)  # behind us already: nothing changes
    assert sequences.take("inventory") == 1001


@settings(max_examples=40, deadline=None)
@given(
    block=st.integers(min_value=1, max_value=5),
    steps=st.lists(st.sampled_from(["take", "take", "take", "crash", "jump"]), max_size=40),
)
def test_sequences_never_go_backwards_across_crashes(
    tmp_path_factory: pytest.TempPathFactory, block: int, steps: list[str]
) -> None:
    state = StateDir(tmp_path_factory.mktemp("seq"))
    state.prepare()
    sequences = Sequences(state, block=block)
    used = [0]
    for step in steps:
        if step == "crash":  # in-memory state lost; only what was persisted survives
            sequences = Sequences(state, block=block)
        elif step == "jump":
            sequences.advance_past("telemetry", used[-1] + 3)
            used.append(used[-1] + 3)
        else:
            number = sequences.take("telemetry")
            assert number > used[-1]
            assert state.load_cursors()["telemetry"] >= number
            used.append(number)


def test_install_credential_replaces_only_the_credential(tmp_path: Path) -> None:
    state, identity = enrolled(tmp_path / "state")
    replacement = f"mfn.{uuid.uuid4().hex}.replacement-secret-0123456789abcdefghijklmn"
    installed = state.install_credential(replacement + "\n")
    assert installed.credential == replacement and installed.node_id == identity.node_id
    assert installed.credential_id == uuid.UUID(hex=replacement.split(".")[1])
    assert state.load_identity() == installed
    assert mode(state.identity_path) == 0o600

    rotated = {
        "node_id": str(identity.node_id),
        "credential_id": str(uuid.uuid4()),
        "credential": CREDENTIAL,
        "revoked_credential_ids": [],
    }
    assert state.install_credential(json.dumps(rotated)).credential == CREDENTIAL


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("garbage-value-xyz", "not a node credential"),
        (f"mfe.{uuid.uuid4().hex}.an-enrollment-token-not-a-credential", "not a node credential"),
        ('{"credential": "x"}', "not the answer of"),
    ],
)
def test_install_credential_refuses_what_is_not_a_credential(
    tmp_path: Path, text: str, message: str
) -> None:
    state, identity = enrolled(tmp_path / "state")
    with pytest.raises(StateError, match=message) as caught:
        state.install_credential(text)
    assert text not in str(caught.value)
    assert state.load_identity() == identity


def test_install_credential_refuses_another_nodes_credential(tmp_path: Path) -> None:
    state, identity = enrolled(tmp_path / "state")
    other = f"mfn.{uuid.uuid4().hex}.another-nodes-secret-0123456789abcdefghijkl"
    rotated = {
        "node_id": str(uuid.uuid4()),
        "credential_id": str(uuid.uuid4()),
        "credential": other,
        "revoked_credential_ids": [],
    }
    with pytest.raises(StateError, match="was issued for node") as caught:
        state.install_credential(json.dumps(rotated))
    assert other not in str(caught.value)
    assert state.load_identity() == identity
    with pytest.raises(StateError, match="holds no identity"):
        StateDir(tmp_path / "empty").install_credential(other)
