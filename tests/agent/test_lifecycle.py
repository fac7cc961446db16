"""End to end with real agent processes (`python -m cli.main agent`) against a real API on
a fresh PostgreSQL database, observed through the admin API as an operator would."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.agent.harness import (
    FAST_API,
    REPO,
    AgentProcess,
    admin,
    advancing,
    clean_env,
    cursor,
    heartbeat_at,
    identity,
    new_token,
    node_detail,
    wait_until,
    write_config,
)
from tests.api_server import RunningApi
from tests.flows import NODES

ApiFactory = Callable[..., RunningApi]
StartAgent = Callable[..., AgentProcess]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def start_enrolled(
    api: RunningApi, agents: StartAgent, tmp_path: Path, **config: Any
) -> tuple[AgentProcess, Path, str]:
    """An agent that enrolled and is online: (process, its config, node id)."""
    state = tmp_path / "state"
    path = write_config(
        tmp_path / "agent.yaml",
        api_url=api.base_url,
        state_dir=str(state),
        enrollment_token=new_token(api, labels={"rack": "e2e"}),
        hostname="gpu-e2e-1",
        storage_paths=[str(tmp_path)],
        **config,
    )
    agent = agents(path)
    agent.wait_for_log(r"enrolled as node")
    node_id = identity(state)["node_id"]
    wait_until(lambda: online_with_data(api, node_id), what="node online with data")
    return agent, path, node_id


def online_with_data(api: RunningApi, node_id: str) -> dict[str, Any] | None:
    detail = node_detail(api, node_id)
    ready = (
        detail["liveness"] == "online"
        and (detail["inventory_stream"] or {}).get("good_sequence")
        and (detail["telemetry_stream"] or {}).get("good_sequence")
        and len(detail["gpus"]) == 2
    )
    return detail if ready else None


def install_credential(state: Path, text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "cli.main",
            "agent",
            "install-credential",
            "--state-dir",
            str(state),
        ],
        cwd=REPO,
        env=clean_env(),
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_enrollment_and_restarts_keep_one_identity_and_rising_sequences(
    api_factory: ApiFactory, agents: StartAgent, tmp_path: Path
) -> None:
    api = api_factory(**FAST_API)
    first, config, node_id = start_enrolled(api, agents, tmp_path)
    state = tmp_path / "state"
    assert mode(state) == 0o700
    assert mode(state / "identity.json") == 0o600
    assert mode(state / "cursors.json") == 0o600
    detail = node_detail(api, node_id)
    assert detail["hostname"] == "gpu-e2e-1" and detail["labels"] == {"rack": "e2e"}
    assert detail["inventory"]["complete"] is True
    gpus = sorted(g["uuid"] for g in detail["gpus"])
    assert first.stop() == 0
    assert "stopped; nothing more is published" in first.output

    # A clean restart: same identity, the (used) token in the config is not used again.
    second = agents(config, tmp_path / "second.log")
    second.wait_for_log(rf"resuming as node {node_id}")
    advancing(api, node_id)
    assert "the enrollment token is not used" in second.output
    # A crash: no chance to persist anything after the last reservation.
    second.proc.kill()
    second.wait()
    crashed_at = {s: cursor(api, node_id, s) for s in ("inventory", "telemetry")}

    third = agents(config, tmp_path / "third.log")
    advancing(api, node_id)
    assert "already received" not in third.output  # sequences never went backwards
    assert all(cursor(api, node_id, s) > crashed_at[s] for s in ("telemetry",))
    assert third.stop() == 0

    # A state dir restored from an old backup: the cursors are behind the server's.
    (state / "cursors.json").write_text(json.dumps({"format": 1, "inventory": 0, "telemetry": 0}))
    restored = agents(config, tmp_path / "restored.log")
    restored.wait_for_log(r"already received \(server cursor \d+\)")
    advancing(api, node_id)
    assert restored.stop() == 0

    with api.client() as client:
        nodes = client.get(NODES, headers=api.admin_headers).json()["items"]
    assert [n["id"] for n in nodes] == [node_id]  # never re-enrolled
    detail = node_detail(api, node_id)
    assert sorted(g["uuid"] for g in detail["gpus"]) == gpus  # stable simulated GPUs
    assert not any(g["missing"] for g in detail["gpus"])


def test_revoke_stops_publishing_then_rotation_is_installed(
    api_factory: ApiFactory, agents: StartAgent, tmp_path: Path
) -> None:
    api = api_factory(**FAST_API)
    agent, config, node_id = start_enrolled(api, agents, tmp_path)
    state = tmp_path / "state"
    admin(api, "POST", f"{NODES}/{node_id}/credential/revoke")
    assert agent.wait() == 3
    log = agent.output
    assert "rejected this node (revoked)" in log and "status=401" in log
    assert "code=credential_revoked" in log and "install-credential" in log
    stopped_at = heartbeat_at(api, node_id)
    time.sleep(1.0)  # a window for a heartbeat that must not come: not a wait
    assert heartbeat_at(api, node_id) == stopped_at

    # Rotation: the operator gets the credential once and installs it in the state dir.
    rotated = admin(api, "POST", f"{NODES}/{node_id}/credential/rotate")
    before = identity(state)
    result = install_credential(state, json.dumps(rotated))
    assert result.returncode == 0, result.stderr
    assert rotated["credential"] not in result.stdout + result.stderr
    after = identity(state)
    assert after["node_id"] == node_id == before["node_id"]
    assert after["credential"] == rotated["credential"] != before["credential"]
    assert mode(state / "identity.json") == 0o600

    # Restart on the same identity; this time rotate while it runs: it picks it up.
    write_config(config, **{**yaml.safe_load(config.read_text()), "credential_reload_wait_s": 20})
    running = agents(config, tmp_path / "running.log")
    advancing(api, node_id)
    rotated = admin(api, "POST", f"{NODES}/{node_id}/credential/rotate")
    assert install_credential(state, rotated["credential"]).returncode == 0
    running.wait_for_log(r"picked up the credential installed in")
    advancing(api, node_id)
    assert running.proc.poll() is None
    assert running.stop() == 0


def test_disable_is_a_403_that_stops_publishing_and_decommission_is_final(
    api_factory: ApiFactory, agents: StartAgent, tmp_path: Path
) -> None:
    api = api_factory(**FAST_API)
    agent, config, node_id = start_enrolled(api, agents, tmp_path)
    admin(api, "PATCH", f"{NODES}/{node_id}", json={"enabled": False})
    assert agent.wait() == 3
    log = agent.output
    assert "rejected this node (disabled)" in log and "status=403" in log
    assert "code=node_disabled" in log and "Re-enable it" in log
    assert node_detail(api, node_id)["liveness"] == "disabled"

    admin(api, "PATCH", f"{NODES}/{node_id}", json={"enabled": True})
    again = agents(config, tmp_path / "again.log")
    advancing(api, node_id)

    plan = admin(api, "GET", f"{NODES}/{node_id}/decommission/preview")["plan_hash"]
    admin(
        api,
        "POST",
        f"{NODES}/{node_id}/decommission",
        json={"confirm_node_id": node_id, "plan_hash": plan, "reason": "e2e"},
    )
    assert again.wait() == 3
    log = again.output
    assert "rejected this node (decommissioned)" in log and "code=node_decommissioned" in log
    assert "enroll it as a new node" in log
    assert node_detail(api, node_id)["liveness"] == "decommissioned"


def test_disconnect_goes_stale_then_offline_and_reconnects_on_the_same_identity(
    api_factory: ApiFactory, agents: StartAgent, tmp_path: Path
) -> None:
    api = api_factory(**FAST_API)
    agent, config, node_id = start_enrolled(api, agents, tmp_path)
    assert agent.stop() == 0
    last = heartbeat_at(api, node_id)
    stopped = time.monotonic()
    wait_until(lambda: node_detail(api, node_id)["liveness"] == "stale", 5, "stale")
    assert time.monotonic() - stopped < 2.0
    wait_until(lambda: node_detail(api, node_id)["liveness"] == "offline", 5, "offline")
    # The heartbeat genuinely stopped; the node did not merely age.
    assert heartbeat_at(api, node_id) == last
    tail = agent.output.split("stopped; nothing more is published")[-1]
    assert "heartbeat" not in tail

    back = agents(config, tmp_path / "back.log")
    back.wait_for_log(rf"resuming as node {node_id}")
    wait_until(lambda: node_detail(api, node_id)["liveness"] == "online", 15, "online again")
    assert heartbeat_at(api, node_id) > last
    assert back.stop() == 0


def test_enrollment_refusals_and_a_second_agent_on_one_state_dir(
    api_factory: ApiFactory, agents: StartAgent, tmp_path: Path
) -> None:
    api = api_factory(**FAST_API)
    agent, config, _ = start_enrolled(api, agents, tmp_path)
    # A second agent on the same state dir would interleave sequences: refused.
    twin = agents(config, tmp_path / "twin.log")
    assert twin.wait() == 1
    assert "another agent is running with state dir" in twin.output
    assert agent.stop() == 0

    # A used token on a fresh state dir: a clear refusal, no identity written.
    used = identity(tmp_path / "state")
    token = yaml.safe_load(config.read_text())["enrollment_token"]
    fresh = write_config(
        tmp_path / "fresh.yaml",
        api_url=api.base_url,
        state_dir=str(tmp_path / "fresh-state"),
        enrollment_token=token,
    )
    refused = agents(fresh)
    assert refused.wait() == 3
    assert "code=enrollment_token_used" in refused.output
    assert "ask an operator for a new one" in refused.output
    assert not (tmp_path / "fresh-state" / "identity.json").exists()
    assert used["credential"] not in refused.output and token not in refused.output

    # No identity and no token: nothing to do but say so.
    none = write_config(
        tmp_path / "none.yaml", api_url=api.base_url, state_dir=str(tmp_path / "none-state")
    )
    lost = agents(none)
    assert lost.wait() == 1
    assert "no enrollment token is configured" in lost.output


def test_enrollment_is_not_retried_forever(agents: StartAgent, tmp_path: Path) -> None:
    """Nothing answers: a bounded number of attempts, one line, exit status 1."""
    config = write_config(
        tmp_path / "agent.yaml",
        api_url="http://127.0.0.1:9",
        state_dir=str(tmp_path / "state"),
        enrollment_token="mfe.0123456789abcdef0123456789abcdef.secret-token-value",
        enroll_max_attempts=3,
        retry_initial_s=0.05,
        retry_max_s=0.1,
    )
    agent = agents(config)
    assert agent.wait(timeout_s=30) == 1
    assert agent.output.count("not enrolled: gave up after 3 attempts") == 1, agent.output
    assert "Traceback" not in agent.output and "secret-token-value" not in agent.output
    assert not (tmp_path / "state" / "identity.json").exists()
