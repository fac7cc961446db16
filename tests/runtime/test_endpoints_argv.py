"""What a deployment serves and which chat template it runs become the runtime worker's
own flags (issue 34): `--embeddings` when embeddings are served, `--chat-template-file`
on the template the worker ships for `chatml-tools`; a profile can no longer set either
(nor turn jinja off), and the wire names a template, never a path or its text."""

from __future__ import annotations

import fnmatch
import tomllib
import uuid
from pathlib import Path

import pytest
from pydantic import ValidationError

from agent.runtime.config import ModelSpec
from agent.runtime.server import TEMPLATES, ServerFailed, endpoint_request, server_argv
from schemas.deployments import DeploymentCreate, LoadSpec
from schemas.endpoints import ChatTemplateCaps
from schemas.llama_flags import local_refusals, profile_refusals
from schemas.runtime import LlamaSettings
from schemas.services import ServiceRollout, ServiceTemplate

pytestmark = pytest.mark.fast

BINARY = Path("/opt/llama/llama-server")
ROOT = Path(__file__).resolve().parents[2]


def spec(**fields: object) -> ModelSpec:
    return ModelSpec.model_validate({"model_id": "m", "path": "/models/m.gguf", **fields})


def test_embeddings_are_on_only_when_served() -> None:
    assert "--embeddings" not in server_argv(BINARY, spec(), 1)
    assert spec().endpoints == ["chat", "completions"]
    served = server_argv(BINARY, spec(endpoints=["embeddings", "chat"]), 1)
    assert served.count("--embeddings") == 1


def test_embeddings_run_on_one_kv_buffer_for_all_slots() -> None:
    """With a KV buffer per slot (an explicit `parallel` gives that) llama.cpp pooled an
    input batched with others from a piece of it only: cosine 0.65 to itself alone."""
    assert "--kv-unified" not in server_argv(BINARY, spec(), 1)
    settings = {"pooling": "mean", "parallel": 4}
    served = server_argv(BINARY, spec(endpoints=["embeddings"], server_args=settings), 1)
    assert served.count("--kv-unified") == 1 and "--no-kv-unified" not in served
    split = {**settings, "no-kv-unified": True}
    with pytest.raises(ServerFailed, match="no-kv-unified: embeddings need the unified"):
        server_argv(BINARY, spec(endpoints=["chat", "embeddings"], server_args=split), 1)
    # Chat alone keeps the operator's choice.
    assert "--no-kv-unified" in server_argv(BINARY, spec(server_args=split), 1)


def test_the_shipped_template_is_chosen_by_name() -> None:
    assert "--chat-template-file" not in server_argv(BINARY, spec(), 1)
    argv = server_argv(BINARY, spec(chat_template="chatml-tools"), 1)
    template = Path(argv[argv.index("--chat-template-file") + 1])
    assert template == TEMPLATES / "chatml-tools.jinja" and template.is_file()
    text = template.read_text()
    # Hermes/Qwen2.5-style tool calls in ChatML, with a system line naming no model, and
    # where it comes from (its licence).
    assert "<tool_call>" in text and "<|im_start|>" in text and "{%- if tools %}" in text
    assert "Qwen, created by" not in text and "Apache License 2.0" in text


@pytest.mark.parametrize("named", ["/etc/passwd", "chatml", "{{ x }}", "", None])
def test_a_template_is_a_name_from_the_list(named: object) -> None:
    with pytest.raises(ValidationError):
        LlamaSettings.model_validate({"chat_template": named})


def test_the_template_ships_with_the_package() -> None:
    """pyproject's package data takes the template into the wheel and the install."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["agent"]
    for template in TEMPLATES.glob("*.jinja"):
        relative = template.relative_to(ROOT / "agent").as_posix()
        assert any(fnmatch.fnmatch(relative, pattern) for pattern in patterns), relative


@pytest.mark.parametrize("flag", ["embeddings", "embedding", "reranking", "rerank", "no-jinja"])
def test_a_profile_cannot_contradict_the_deployment(flag: str) -> None:
    [refusal] = profile_refusals({flag: True})
    assert "set by the runtime worker or a structured field" in refusal.reason
    # Nor can the node's own config: its models declare `endpoints` instead.
    assert local_refusals({flag: True})


def test_pooling_stays_the_profiles() -> None:
    assert profile_refusals({"pooling": "mean"}) == []
    assert profile_refusals({"pooling": "sum"})


@pytest.mark.parametrize(
    "endpoints", [[], ["chat", "chat"], ["images"], ["chat", "completions", "embeddings", "chat"]]
)
def test_endpoints_are_one_to_three_known_ones_each_once(endpoints: list[str]) -> None:
    body = {
        "node_id": str(uuid.uuid4()), "device_id": "cpu", "profile_id": str(uuid.uuid4()),
        "environment_id": str(uuid.uuid4()), "model": "m",
        "artifact": {"repository": "o/r", "commit": "a" * 40, "path": "m.gguf"},
    }  # fmt: skip
    assert DeploymentCreate.model_validate(body).endpoints == ["chat", "completions"]
    ordered = DeploymentCreate.model_validate({**body, "endpoints": ["embeddings", "chat"]})
    assert ordered.endpoints == ["chat", "embeddings"]
    with pytest.raises(ValidationError):
        DeploymentCreate.model_validate({**body, "endpoints": endpoints})
    with pytest.raises(ValidationError):
        ServiceRollout.model_validate({"endpoints": endpoints})


def test_what_was_stored_before_endpoints_serves_the_default_ones() -> None:
    default = LoadSpec.model_fields["endpoints"].get_default(call_default_factory=True)
    assert default == ["chat", "completions"]
    template = {
        "artifact": {"repository": "o/r", "revision": "main", "commit": "a" * 40,
                     "path": "m.gguf", "size_bytes": 1},
        "profile_id": str(uuid.uuid4()), "profile_version": 1, "environment_id": None,
        "max_concurrent": 4,
    }  # fmt: skip
    assert ServiceTemplate.model_validate(template).endpoints == ["chat", "completions"]


def test_each_endpoint_is_checked_with_its_smallest_request() -> None:
    assert endpoint_request("chat", "m", "hi")[0] == "/v1/chat/completions"
    assert endpoint_request("completions", "m", "hi") == (
        "/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 1}
    )  # fmt: skip
    assert endpoint_request("embeddings", "m", "hi") == (
        "/v1/embeddings", {"model": "m", "input": "hi"}
    )  # fmt: skip


def test_the_caps_are_read_from_props_and_nothing_else() -> None:
    props = {
        "chat_template_caps": {
            "supports_tools": True, "supports_tool_calls": True,
            "supports_parallel_tool_calls": False, "supports_system_role": True,
        },
        "chat_template": "…",
    }  # fmt: skip
    assert ChatTemplateCaps.from_props(props) == ChatTemplateCaps(
        supports_tools=True, supports_tool_calls=True
    )
    assert ChatTemplateCaps.from_props({}) is None
    assert ChatTemplateCaps.from_props([1]) is None
    assert ChatTemplateCaps.from_props({"chat_template_caps": {"supports_tools": "yes"}}) is None
