"""Runtime probes end to end, all real: the API with its workers, an agent that acquires
the model through an artifact job from a local Hub-layout server, and the runtime worker
beside it (the node's credential from the agent's state dir) that reports its binary,
is woken by the job's notification, claims the probe, runs the real llama-server and
reports layered health and evidence."""

from __future__ import annotations

import os
import shutil
import signal
import threading
from pathlib import Path

from schemas.protocol import NODES, RUNTIME_EVIDENCE, RUNTIME_JOBS
from tests.agent.artifact_agent import ended
from tests.agent.harness import admin, wait_until
from tests.runtime.probing import COMMIT, GGUF, REPO, ProbeNode, device_job, probe
from tests.runtime_flows import create_profile


def test_a_probe_succeeds_with_measured_evidence(probe_node: ProbeNode) -> None:
    api, node_id = probe_node.api, probe_node.node_id
    runtime, environment = probe_node.runtime()
    with api.client() as client:
        profile = create_profile(client, api, "probe-small", ctx_size=512, threads=2)
    done = probe(api, node_id, profile["id"], environment)
    assert done["state"] == "succeeded", (done, runtime.output[-3000:])
    [row] = admin(api, "GET", RUNTIME_EVIDENCE, params={"node_id": node_id})["items"]
    assert row["health"] == {
        "process_up": True, "health_ok": True, "model_listed": True, "inference_ok": True,
    }  # fmt: skip
    evidence = row["evidence"]
    assert evidence["load_s"] > 0 and evidence["time_to_first_token_s"] > 0
    assert evidence["prompt_tokens_per_s"] > 0 and evidence["generation_tokens_per_s"] > 0
    assert evidence["peak_rss_bytes"] > 50_000_000  # the model is mapped in
    assert row["device_id"] == "cpu" and row["profile_id"] == profile["id"]
    assert row["environment_id"] == environment
    wait_until(
        lambda: admin(api, "GET", f"{NODES}/{node_id}/runtime")["loaded_models"],
        10,
        "the loaded model in the runtime report",
    )
    # The same device through runtime.health.v1 and runtime.unload.v1.
    health = device_job(api, node_id, "runtime.health.v1")
    assert health["state"] == "succeeded", health
    assert health["result"]["health"]["inference_ok"] is True
    assert health["result"]["loaded_model"].startswith("probe-")
    unload = device_job(api, node_id, "runtime.unload.v1")
    assert unload["state"] == "succeeded", unload
    assert unload["result"]["unloaded_model"] == health["result"]["loaded_model"]
    assert unload["result"]["settle_s"] is not None
    after = device_job(api, node_id, "runtime.health.v1")
    assert after["result"]["health"]["process_up"] is False
    assert after["result"]["loaded_model"] is None
    wait_until(
        lambda: not admin(api, "GET", f"{NODES}/{node_id}/runtime")["loaded_models"],
        10,
        "the unload in the runtime report",
    )


def test_digest_mismatches_are_typed_failures(probe_node: ProbeNode, tmp_path: Path) -> None:
    api, node_id, model_file = probe_node.api, probe_node.node_id, probe_node.model_file
    binary = tmp_path / "bin" / "llama-server"
    binary.parent.mkdir()
    shutil.copy2(probe_node.binary, binary)
    _, environment = probe_node.runtime(binary)
    with api.client() as client:
        profile = create_profile(client, api, "probe-small", ctx_size=512, threads=2)
    # The file on the node changes after the control plane recorded its digest.
    with model_file.open("r+b") as handle:
        handle.seek(1000)
        handle.write(b"\0corrupt\0")
    failed = probe(api, node_id, profile["id"], environment)
    assert failed["state"] == "failed"
    assert failed["failure"]["code"] == "artifact_digest_mismatch"
    # The binary is no longer the one the environment names.
    with binary.open("ab") as handle:
        handle.write(b"\0")
    failed = probe(api, node_id, profile["id"], environment)
    assert failed["failure"]["code"] == "binary_digest_mismatch"
    assert failed["failure"]["retryable"] is False


def test_an_operator_cancel_stops_a_probe_waiting_for_its_device(
    probe_node: ProbeNode, instruct_model: Path
) -> None:
    """The device is busy with a long local request; the probe claimed meanwhile waits
    its turn, keeping its lease; the operator cancels it; it ends cancelled without
    having run (its progress report carried the cancel)."""
    api, node_id = probe_node.api, probe_node.node_id
    smol = {"model_id": "smol", "path": str(instruct_model), "threads": 2, "ctx_size": 512}
    runtime, environment = probe_node.runtime(models=[smol])
    with api.client() as client:
        profile = create_profile(client, api, "probe-small", ctx_size=512, threads=2)

    def busy() -> None:
        with runtime.client() as http:
            story = [{"role": "user", "content": "Tell a very long story."}]
            body = {"model": "smol", "max_tokens": 400, "temperature": 1.0, "messages": story}
            assert http.post("/v1/chat/completions", json=body).status_code == 200

    holder = threading.Thread(target=busy)
    holder.start()
    wait_until(lambda: runtime.inventory()["devices"][0]["queue_depth"] >= 1, 30, "the busy device")
    # Freeze the server mid-request: the device stays held, whatever the machine's pace.
    server = runtime.server_pid()
    assert server is not None
    os.kill(server, signal.SIGSTOP)
    try:
        with api.client() as client:
            body = {"node_id": node_id, "profile_id": profile["id"],
                    "environment_id": environment,
                    "artifact": {"repository": REPO, "commit": COMMIT, "path": GGUF}}  # fmt: skip
            created_probe = client.post(RUNTIME_JOBS, json=body, headers=api.admin_headers)
            assert created_probe.status_code == 201, created_probe.text
            job_id = created_probe.json()["id"]
            wait_until(
                lambda: admin(api, "GET", f"{RUNTIME_JOBS}/{job_id}")["state"] == "leased",
                15, "the claim",
            )  # fmt: skip
            cancel = client.post(f"{RUNTIME_JOBS}/{job_id}/cancel", headers=api.admin_headers)
            assert cancel.status_code == 200, cancel.text

        # A progress report recorded after the cancel was answered with it: the waiting
        # probe has been told before its turn comes.
        def last_report() -> str:
            progress = admin(api, "GET", f"{RUNTIME_JOBS}/{job_id}")["progress"] or {}
            return str(progress.get("reported_at") or "")

        told = last_report()
        wait_until(lambda: last_report() > told, 30, "a progress report after the cancel")
    finally:
        os.kill(server, signal.SIGCONT)
    done = ended(api, job_id, 60, collection=RUNTIME_JOBS)
    holder.join(timeout=60)
    assert done["state"] == "cancelled", done
    assert admin(api, "GET", RUNTIME_EVIDENCE, params={"node_id": node_id})["items"] == []
    assert "llama-server for probe-" not in runtime.output, "nothing was loaded for it"
