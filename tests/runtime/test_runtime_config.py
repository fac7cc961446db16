"""The runtime worker's config and the llama-server argv it becomes: typed fields,
the typed escape hatch, the flags it keeps for itself, override merging."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agent.errors import ConfigError
from agent.runtime.backends import UnsupportedBackend, backend
from agent.runtime.config import ModelSpec, load_runtime_config
from agent.runtime.server import LOOPBACK, server_argv

pytestmark = pytest.mark.fast

BINARY = Path("/opt/llama/llama-server")
ALL_INTERFACES = "0.0.0.0"  # noqa: S104 (what the config must refuse)


def spec(**fields: object) -> ModelSpec:
    return ModelSpec.model_validate({"model_id": "m", "path": "/models/m.gguf", **fields})


def test_every_structured_field_becomes_its_flag() -> None:
    model = spec(
        ctx_size=8192, batch_size=1024, ubatch_size=256, threads=8, threads_batch=4,
        gpu_layers=60, main_gpu=1, tensor_split=[0.6, 0.4], flash_attn=True, alias="planner",
    )  # fmt: skip
    argv = server_argv(BINARY, model, 4321, key_file=Path("/run/mf/llama-server-cpu.key"))
    assert argv[:9] == [str(BINARY), "--model", "/models/m.gguf", "--host", LOOPBACK,
                        "--port", "4321", "--api-key-file",
                        "/run/mf/llama-server-cpu.key"]  # fmt: skip
    pairs = dict(zip(argv[9::2], argv[10::2], strict=True))
    assert pairs == {
        "--alias": "planner", "--ctx-size": "8192", "--batch-size": "1024",
        "--ubatch-size": "256", "--threads": "8", "--threads-batch": "4",
        "--n-gpu-layers": "60", "--main-gpu": "1", "--tensor-split": "0.6,0.4",
        "--flash-attn": "on",
    }  # fmt: skip


def test_server_args_are_typed_values_each_one_argv_element() -> None:
    model = spec(server_args={"parallel": 1, "cont-batching": True, "no-warmup": False,
                              "temp": 0.5, "chat-template": "chatml; rm -rf /"})  # fmt: skip
    argv = server_argv(BINARY, model, 1)
    tail = argv[argv.index("--alias") + 2 :]
    assert tail == ["--parallel", "1", "--cont-batching", "--temp", "0.5",
                    "--chat-template", "chatml; rm -rf /"]  # fmt: skip


def test_a_draft_model_and_loras_become_their_flags() -> None:
    loras = [{"path": "/models/a.gguf"}, {"path": "/models/b.gguf", "scale": 0.5}]
    model = spec(draft_model="/models/draft.gguf", loras=loras)
    argv = server_argv(BINARY, model, 1)
    tail = argv[argv.index("--alias") + 2 :]
    assert tail == ["--model-draft", "/models/draft.gguf", "--lora-scaled", "/models/a.gguf:1",
                    "--lora-scaled", "/models/b.gguf:0.5"]  # fmt: skip


@pytest.mark.parametrize(
    "server_args",
    [
        {"host": ALL_INTERFACES},
        {"port": 80},
        {"model": "/etc/passwd"},
        {"api-prefix": "/x"},
        {"ctx-size": 4},  # a structured field's flag: set it as the field
        {"tools": "all"},
        {"agent": True},
        {"ag": True},
        {"mcp-servers-json": "{}"},
        {"mcp-servers-config": "/tmp/mcp.json"},
        {"webui": True},
        {"ui-mcp-proxy": True},
        {"--parallel": 1},
        {"Parallel": 1},
        {"parallel": [1, 2]},
        {"parallel": {"a": 1}},
        {"chat-template": "a\nb"},
        # A value that llama-server would read as a flag of its own.
        {"log-prefix": "--agent"},
        {"chat-template": True, "no-warmup": "--tools"},
        {"log-file": "-x"},
    ],
)
def test_the_local_escape_hatch_refuses_managed_and_tool_flags(server_args: object) -> None:
    with pytest.raises(ValueError, match="server_args"):
        spec(server_args=server_args)


def test_the_local_escape_hatch_keeps_the_node_operators_own_files() -> None:
    model = spec(server_args={"log-file": "/var/log/llama.log", "slot-save-path": "/srv/slots",
                              "override-kv": "-1", "seed": -1})  # fmt: skip
    assert model.server_args["log-file"] == "/var/log/llama.log"


def test_a_relative_model_path_is_refused() -> None:
    with pytest.raises(ValueError, match="absolute"):
        spec(path="models/m.gguf")


def test_the_override_is_deep_merged(tmp_path: Path) -> None:
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({
        "llama_server_path": "/path/to/llama-server", "run_dir": "/run/mf",
        "models": [{"model_id": "m", "path": "/path/to/model-weights"}],
        "llama_server_startup_timeout_s": 30,
    }))  # fmt: skip
    local = tmp_path / "local.yaml"
    local.write_text(yaml.safe_dump({
        "llama_server_path": str(BINARY),
        "models": [{"model_id": "m", "path": "/models/real.gguf", "ctx_size": 4096}],
    }))  # fmt: skip
    config = load_runtime_config(base, local)
    assert config.llama_server_path == BINARY
    assert config.llama_server_startup_timeout_s == 30
    assert config.models[0].path == Path("/models/real.gguf")
    assert config.listen_host == "127.0.0.1"


def test_an_invalid_config_names_the_field_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"llama_server_path": "/x", "run_dir": "/r", "models": [
        {"model_id": "m", "path": "/m", "server_args": {"host": ALL_INTERFACES}}]}))  # fmt: skip
    with pytest.raises(ConfigError, match=r"invalid runtime configuration: models\.0\.server_args"):
        load_runtime_config(path)


@pytest.mark.parametrize("name", ["metal", "rocm", "sycl", "vulkan"])
def test_other_backends_say_plainly_that_this_build_lacks_them(name: str) -> None:
    with pytest.raises(UnsupportedBackend, match=f"{name!r} is not supported by this build"):
        backend(name)


def test_the_cpu_backend_hides_every_gpu_from_its_server() -> None:
    cpu = backend("cpu")
    [device] = cpu.devices()
    assert device.id == "cpu"
    assert cpu.environment(device) == {"CUDA_VISIBLE_DEVICES": ""}
    metrics = cpu.metrics(device)
    assert metrics.memory_total_bytes and metrics.memory_free_bytes


def test_the_example_config_is_valid() -> None:
    example = Path(__file__).resolve().parents[2] / "agent" / "runtime" / "runtime.example.yaml"
    config = load_runtime_config(example)
    assert config.models[0].server_args == {"parallel": 1}
    assert server_argv(BINARY, config.models[0], 1)[-2:] == ["--parallel", "1"]
