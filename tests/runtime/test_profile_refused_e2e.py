"""The node's own check of a profile, end to end with a real agent, a real runtime worker
and the real llama-server: a job whose profile was changed behind the API's back to
carry llama-server's tool flags is refused by the runtime worker (`profile_refused`)
before anything starts; a profile's draft model, an artifact reference, reaches
llama-server as the verified file on the node."""

from __future__ import annotations

import json
from pathlib import Path

import psutil

from schemas.protocol import RUNTIME_JOBS, RUNTIME_PROFILES
from tests.agent.artifact_agent import ended
from tests.runtime.probing import COMMIT, GGUF, REPO, ProbeNode, probe
from tests.runtime_flows import create_profile
from tests.services import admin_execute


def test_a_job_with_tool_flags_slipped_past_the_api_is_refused_on_the_node(
    probe_node: ProbeNode, llama_server: Path
) -> None:
    api, node_id = probe_node.api, probe_node.node_id
    runtime, environment = probe_node.runtime()
    # The worker is away while the job is created and changed, so it cannot claim the
    # clean version first.
    runtime.stop()
    with api.client() as client:
        profile = create_profile(client, api, "clean", ctx_size=512, threads=2)
        body = {"node_id": node_id, "profile_id": profile["id"], "environment_id": environment,
                "artifact": {"repository": REPO, "commit": COMMIT, "path": GGUF},
                "max_attempts": 1}  # fmt: skip
        created = client.post(RUNTIME_JOBS, json=body, headers=api.admin_headers)
        assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    hostile = json.dumps({"agent": True, "tools": "all", "ctx-size": 512})
    statement = "UPDATE jobs SET spec = jsonb_set(spec, '{settings,server_args}', "
    admin_execute(
        api.settings.database_url,
        f"{statement}'{hostile}'::jsonb) WHERE id = '{job_id}'",
    )
    runtime.start()
    done = ended(api, job_id, 60, collection=RUNTIME_JOBS)
    assert done["state"] == "failed", done
    assert done["failure"]["code"] == "profile_refused"
    assert done["failure"]["retryable"] is False
    for flag in ("--agent", "--tools", "--ctx-size"):
        assert flag in done["failure"]["detail"]
    assert runtime.server_pid() is None, "no llama-server was started"
    assert "llama-server for probe-" not in runtime.output
    # Only this node's: other tests on a shared box may run llama-servers of their own.
    mine = str(probe_node.model_file)
    assert not [
        p
        for p in psutil.process_iter(["exe", "cmdline"])
        if p.info["exe"] == str(llama_server) and mine in (p.info["cmdline"] or [])
    ]


def test_a_draft_model_is_an_artifact_resolved_to_the_verified_file(
    probe_node: ProbeNode,
) -> None:
    api, node_id, model_file = probe_node.api, probe_node.node_id, probe_node.model_file
    runtime, environment = probe_node.runtime()
    ref = {"repository": REPO, "commit": COMMIT, "path": GGUF}
    with api.client() as client:
        # The model is its own draft: the same vocabulary, and the file is on the node.
        profile = create_profile(client, api, "drafted", ctx_size=512, threads=2,
                                 draft_model=ref, server_args={"spec-draft-n-max": 4})  # fmt: skip
        listed = client.get(f"{RUNTIME_PROFILES}/{profile['id']}", headers=api.admin_headers)
        assert listed.json()["settings"]["draft_model"] == ref
    done = probe(api, node_id, profile["id"], environment)
    assert done["state"] == "succeeded", (done, runtime.output[-3000:])
    assert done["spec"]["draft_model"]["path"] == str(model_file)
    server = runtime.server_pid()
    assert server is not None
    argv = psutil.Process(server).cmdline()
    assert argv[argv.index("--model-draft") + 1] == str(model_file)
    assert argv[argv.index("--spec-draft-n-max") + 1] == "4"
