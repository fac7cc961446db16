"""The runtime worker's configuration: the agent's YAML scheme (a tracked base, a
deep-merged override, then `MODELFORGE_RUNTIME_*` variables).

    modelforge runtime --config runtime.example.yaml --config-override runtime.local.yaml

Models carry the common llama-server settings as typed fields (schemas/runtime.py:
LlamaTuning, as a RuntimeProfile does); `server_args` is the node operator's escape
hatch for the rest, a mapping of flag name to a typed scalar turned into argv elements
(never a shell string). It is wider than a profile's allow-list (the node's own operator
may name a file), but flags the worker manages itself (where the server listens, which
model it loads) and the tool, agent, MCP and web-UI families are refused there too
(schemas/llama_flags.py: LOCAL_REFUSED).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Field, Strict, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from agent.config import YamlSettings, load_settings
from agent.failover import checked_endpoint, checked_failover
from schemas.endpoints import Endpoints, default_endpoints
from schemas.llama_flags import local_refusals
from schemas.runtime import LlamaTuning, ServerArg

ENV_PREFIX = "MODELFORGE_RUNTIME_"
Backend = Literal["cpu", "cuda", "metal", "rocm", "sycl", "vulkan"]


def _cpu_only() -> list[Backend]:
    return ["cpu"]


def _locally_allowed(server_args: dict[str, ServerArg]) -> dict[str, ServerArg]:
    refusals = local_refusals(server_args)
    if refusals:
        raise ValueError("server_args: " + "; ".join(r.reason for r in refusals))
    return server_args


# Long names, and llama.cpp's capitalised short ones (-C, -Cr).
LOCAL_FLAG_PATTERN = r"^([a-z][a-z0-9.+-]*|[A-Z][a-z]{0,2})$"
LocalServerArgs = Annotated[
    dict[Annotated[str, Strict(), Field(max_length=64, pattern=LOCAL_FLAG_PATTERN)], ServerArg],
    Field(max_length=64),
    AfterValidator(_locally_allowed),
]


class LoraFile(BaseModel):
    path: Path
    scale: float = 1.0


class ModelSpec(LlamaTuning):
    """A configured model: what it is called and where its file is, and its settings.
    A probe's model is one too, built from a profile the allow-list admitted, with its
    draft model and LoRAs resolved to verified files."""

    model_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")
    path: Path
    roles: list[str] = Field(default_factory=list, max_length=32)
    alias: str | None = Field(default=None, min_length=1, max_length=128)
    server_args: LocalServerArgs = Field(default_factory=dict)
    draft_model: Path | None = None
    loras: list[LoraFile] = Field(default_factory=list, max_length=8)
    # What it serves (`--embeddings` when embeddings are), each checked at load.
    endpoints: Endpoints = Field(default_factory=default_endpoints)

    @field_validator("path", "draft_model")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_absolute():
            raise ValueError("a model's path must be absolute")
        return value

    @property
    def served_name(self) -> str:
        return self.alias or self.model_id


class RuntimeConfig(YamlSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid")

    # The control plane (outbound only), as the agent's config has it, and the agent's
    # state dir, whose identity and credential the runtime worker uses, read only.
    # Without api_url the worker serves its local endpoints and reports nowhere.
    api_url: str | None = None
    # More endpoints of the same control plane, as the agent's config has them.
    api_urls: list[str] = Field(default_factory=list, max_length=16)
    state_dir: Path | None = None
    ca_bundle: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None
    trust_env: bool = True
    request_timeout_s: float = Field(default=10.0, gt=0)
    # The runtime report (devices, models, queues, binaries) at least this often, and
    # at once after a load or an unload.
    report_interval_s: float = Field(default=30.0, gt=0)
    job_poll_interval_s: float = Field(default=5.0, gt=0)
    llama_server_path: Path
    # Where the files a runtime job loads may be (the agent's artifact_roots). Empty: no
    # probe loads anything (any file the worker can read could be named otherwise).
    artifact_roots: list[Path] = Field(default_factory=list, max_length=16)
    # The models the local endpoints serve (none: a worker that only runs probes).
    models: list[ModelSpec] = Field(default_factory=list, max_length=256)
    backends: list[Backend] = Field(default_factory=_cpu_only, min_length=1)
    # The local OpenAI-compatible endpoints. llama-server itself always listens on
    # 127.0.0.1 (not configurable).
    listen_host: str = "127.0.0.1"
    listen_port: int = Field(default=8090, ge=0, le=65535)
    # Pidfiles of the servers this worker started, so a restarted worker reaps leftovers.
    run_dir: Path
    llama_server_startup_timeout_s: float = Field(default=30.0, gt=0)
    # The startup timeout restarts whenever the server shows loading progress, but never
    # past this.
    llama_server_startup_cap_s: float = Field(default=600.0, gt=0)
    llama_server_probe_interval_s: float = Field(default=0.5, gt=0)
    llama_server_stop_grace_s: float = Field(default=10.0, gt=0)
    max_pending_requests_per_device: int = Field(default=2, ge=1, le=10_000)
    # A chat completion without max_tokens gets this many at most; one asking for more
    # than the ceiling is refused (400). A request without a bound holds its device
    # until the model stops by itself, which a small model may never do.
    default_max_tokens: int = Field(default=512, ge=1, le=1_000_000)
    max_tokens_ceiling: int = Field(default=8192, ge=1, le=1_000_000)
    # On SIGTERM: new requests are refused at once (503); those in flight get this long
    # to finish, then end with a clean error, and every llama-server is stopped.
    shutdown_grace_s: float = Field(default=10.0, ge=0, le=3600)
    # After an unload, wait (at most this long) for the device's memory to be freed.
    unload_settle_timeout_s: float = Field(default=30.0, ge=0)
    # RoleMesh compatibility: register and heartbeat to a dispatcher, if set.
    dispatcher_base_url: str | None = None
    dispatcher_heartbeat_interval_s: float = Field(default=10.0, gt=0)
    node_name: str | None = None
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @field_validator("models")
    @classmethod
    def _unique(cls, value: list[ModelSpec]) -> list[ModelSpec]:
        names = [m.model_id for m in value]
        if len(names) != len(set(names)):
            raise ValueError("model_id values must be unique")
        return value

    @model_validator(mode="after")
    def _max_tokens(self) -> RuntimeConfig:
        if self.default_max_tokens > self.max_tokens_ceiling:
            raise ValueError("default_max_tokens must not exceed max_tokens_ceiling")
        return self

    @model_validator(mode="after")
    def _control_plane(self) -> RuntimeConfig:
        if self.api_url is not None and self.state_dir is None:
            raise ValueError("api_url needs state_dir (the agent's, for the node credential)")
        if self.api_url is not None:
            self.api_url = checked_endpoint(self.api_url)
        self.api_urls = checked_failover(self.api_url, self.api_urls)
        return self

    def model(self, model_id: str) -> ModelSpec | None:
        return next((m for m in self.models if model_id in (m.model_id, m.alias)), None)


def load_runtime_config(
    config: Path | None = None, override: Path | None = None, **values: Any
) -> RuntimeConfig:
    return load_settings(RuntimeConfig, "runtime", config, override, values)
