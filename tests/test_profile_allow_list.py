"""A runtime profile carries only what the llama-server allow-list admits
(schemas/llama_flags.py), through the real API and PostgreSQL: every dangerous family is
refused with 422 `server_flag_refused` naming the flag, values outside their type and
bounds likewise; a draft model and LoRAs are artifact references resolved on the node to
verified files; a profile stored before a flag was refused still lists, and probes with
it are refused."""

from __future__ import annotations

import json
from typing import Any

import pytest

from schemas.protocol import RUNTIME_JOBS, RUNTIME_JOBS_NEXT, RUNTIME_PROFILES
from tests.admin_helpers import ok, refused
from tests.api_server import ApiFactory, RunningApi
from tests.artifact_flows import COMMIT, REPOSITORY
from tests.runtime_flows import (
    ARTIFACT_PATH,
    ARTIFACT_SHA256,
    GGUF,
    create_probe,
    create_profile,
    environment_id,
    probe_body,
    ready_node,
)
from tests.services import admin_execute

# One flag of every family that must never reach a node from the control plane, with a
# value of the kind it takes.
DANGEROUS: dict[str, Any] = {
    "agent": True,
    "ag": True,
    "tools": "all",
    "tools-runtime": "bash",
    "mcp-servers-config": "/tmp/mcp.json",
    "mcp-servers-json": '{"x": {"command": "sh"}}',
    "webui": True,
    "ui-mcp-proxy": True,
    "webui-config-file": "/etc/passwd",
    "log-file": "/etc/cron.d/x",
    "log-prompts-dir": "/tmp/prompts",
    "slot-save-path": "/tmp",
    "media-path": "/",
    "models-dir": "/",
    "video-ffmpeg-dir": "/tmp",
    "chat-template-file": "/etc/shadow",
    "grammar-file": "/etc/shadow",
    "lora": "/tmp/evil.gguf",
    "model-draft": "/tmp/evil.gguf",
    "control-vector": "/tmp/x",
    "model-url": "https://example.com/m.gguf",
    "hf-repo": "someone/model",
    "rpc": "10.0.0.1:50052",
    "cors-origins": "*",
    "host": "0.0.0.0",  # noqa: S104 (what must be refused)
    "port": 80,
    "api-key": "secret",
    "ssl-key-file": "/etc/ssl/key.pem",
    "chat-template": "{{ x }}",
    "grammar": "root ::= x",
    "override-kv": "a=int:1",
    "verbose": True,
    "cpu-mask": "ff",
    "version": True,
    "gpt-oss-20b-default": True,
    "not-a-flag-at-all": 1,
}


@pytest.fixture
def runtime_api(api_factory: ApiFactory) -> RunningApi:
    return api_factory(job_retry_base_s=0.2, job_retry_max_s=0.5, job_lease_s=30)


def post_profile(api: RunningApi, settings: dict[str, Any]) -> Any:
    with api.client() as client:
        return client.post(
            RUNTIME_PROFILES,
            json={"name": "hostile", "settings": settings},
            headers=api.admin_headers,
        )


def test_every_dangerous_family_is_refused_naming_the_flag(runtime_api: RunningApi) -> None:
    for flag, value in DANGEROUS.items():
        body = refused(post_profile(runtime_api, {"server_args": {flag: value}}), 422,
                       "server_flag_refused")  # fmt: skip
        assert body["extra"]["flags"] == [flag], body
        assert f"--{flag}" in body["message"]
    # All of them at once: every one is named.
    body = refused(post_profile(runtime_api, {"server_args": DANGEROUS}), 422,
                   "server_flag_refused")  # fmt: skip
    assert sorted(body["extra"]["flags"]) == sorted(DANGEROUS)


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("parallel", 100_000),
        ("parallel", "4"),
        ("parallel", True),
        ("temp", -1),
        ("top-p", 1.5),
        ("cache-type-k", "q9_9"),
        ("cache-type-k", "f16; sh"),
        ("cont-batching", "yes"),
        ("np", 4),  # an alias: the wire takes one spelling
    ],
)
def test_values_outside_their_type_and_bounds_are_refused(
    runtime_api: RunningApi, flag: str, value: Any
) -> None:
    body = refused(post_profile(runtime_api, {"server_args": {flag: value}}), 422,
                   "server_flag_refused")  # fmt: skip
    assert body["extra"]["flags"] == [flag]


def test_allowed_flags_within_bounds_are_kept(runtime_api: RunningApi) -> None:
    server_args = {"parallel": 2, "cont-batching": True, "temp": 0.7, "top-p": 0.9,
                   "cache-type-k": "q8_0", "no-warmup": False, "n-predict": 256}  # fmt: skip
    response = post_profile(runtime_api, {"server_args": server_args})
    assert response.status_code == 201, response.text
    assert response.json()["settings"]["server_args"] == server_args


def test_a_draft_model_and_loras_are_artifacts_resolved_on_the_node(
    runtime_api: RunningApi,
) -> None:
    api = runtime_api
    ref = {"repository": REPOSITORY, "commit": COMMIT, "path": GGUF}
    with api.client() as client:
        node = ready_node(client, api)
        environment = environment_id(client, api)
        missing = create_profile(client, api, "drafted-missing",
                                 draft_model={**ref, "path": "absent.gguf"})  # fmt: skip
        refused(create_probe(client, api, probe_body(node, missing["id"], environment)), 422,
                "artifact_not_on_node")  # fmt: skip
        profile = create_profile(client, api, "drafted", draft_model=ref,
                                 loras=[{"artifact": ref, "scale": 0.5}])  # fmt: skip
        created = create_probe(client, api, probe_body(node, profile["id"], environment))
        assert created.status_code == 201, created.text
        claim = ok(client.get(RUNTIME_JOBS_NEXT, headers=node.headers))
    spec = claim["spec"]
    assert spec["draft_model"] == {"path": ARTIFACT_PATH, "sha256": ARTIFACT_SHA256}
    assert spec["loras"] == [{"path": ARTIFACT_PATH, "sha256": ARTIFACT_SHA256, "scale": 0.5}]
    # A path is never taken from the profile: only a reference to an artifact.
    body = refused(post_profile(api, {"draft_model": "/tmp/evil.gguf"}), 422,
                   "validation_failed")  # fmt: skip
    assert body["details"][0]["location"][-1] == "draft_model"


def test_a_profile_stored_before_a_flag_was_refused_lists_but_probes_no_more(
    runtime_api: RunningApi,
) -> None:
    api = runtime_api
    with api.client() as client:
        node = ready_node(client, api)
        environment = environment_id(client, api)
        profile = create_profile(client, api, "old")
        hostile = json.dumps({"server_args": {"agent": True, "tools": "all"}})
        # Behind the API's back, as a profile stored by an earlier version would be.
        update = f"UPDATE runtime_profiles SET settings = '{hostile}'::jsonb"  # noqa: S608
        admin_execute(api.settings.database_url, f"{update} WHERE id = '{profile['id']}'")
        listed = ok(client.get(f"{RUNTIME_PROFILES}/{profile['id']}", headers=api.admin_headers))
        assert listed["settings"]["server_args"] == {"agent": True, "tools": "all"}
        body = refused(create_probe(client, api, probe_body(node, profile["id"], environment)),
                       422, "server_flag_refused")  # fmt: skip
        assert sorted(body["extra"]["flags"]) == ["agent", "tools"]
        jobs = ok(client.get(RUNTIME_JOBS, headers=api.admin_headers))["items"]
        assert jobs == []
