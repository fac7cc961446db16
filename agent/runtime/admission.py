"""What a lease that loads a model must pass before anything starts, whichever kind
carries it (runtime.probe.v1, agent/runtime/probe.py; deployment.load.v1,
agent/runtime/deployments.py): its settings admitted under this node's allow-list, the
binary and its files verified digest for digest inside the artifact roots; and how a
server that could not be made ready is reported as the job's failure."""

from __future__ import annotations

import asyncio
import hashlib
import stat
from pathlib import Path
from typing import Protocol

from pydantic import ValidationError

from agent.runtime.config import LoraFile, ModelSpec, RuntimeConfig
from agent.runtime.jobs import RuntimeFailed
from agent.runtime.server import ServerFailed
from schemas.endpoints import Endpoint, default_endpoints
from schemas.runtime import (
    LlamaSettings,
    LlamaTuning,
    ResolvedLora,
    RuntimeFailure,
    StoredSettings,
    VerifiedFile,
)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


class LeasedFiles(Protocol):
    """What a lease that loads a model carries (a probe's, a deployment load's): the
    profile's stored settings and the files, each with the digest it must have."""

    @property
    def artifact_path(self) -> str: ...
    @property
    def artifact_digest(self) -> str: ...
    @property
    def settings(self) -> StoredSettings: ...
    @property
    def draft_model(self) -> VerifiedFile | None: ...
    @property
    def loras(self) -> list[ResolvedLora]: ...
    @property
    def binary_sha256(self) -> str: ...


def admitted_settings(spec: LeasedFiles) -> LlamaSettings:
    """The lease's profile under this node's allow-list (schemas/llama_flags.py), checked
    before anything is verified or started: whatever the control plane let through, a
    flag the table does not admit never reaches argv."""
    try:
        settings = LlamaSettings.model_validate(spec.settings)
    except ValidationError as exc:
        reasons = "; ".join(str(error["msg"]) for error in exc.errors())
        raise RuntimeFailed(RuntimeFailure.PROFILE_REFUSED, reasons) from None
    # llama.cpp splits --lora-scaled at commas and colons.
    for lora in spec.loras:
        if any(mark in lora.path for mark in ',:"\n'):
            raise RuntimeFailed(RuntimeFailure.PROFILE_REFUSED, "a LoRA path llama.cpp cannot take")
    return settings


def verify_files(spec: LeasedFiles, binary: Path, roots: list[Path]) -> None:
    """The binary and the files are the ones the lease names, digest for digest, and
    the files lie in the worker's artifact roots (blocking: run it in a thread)."""
    if not binary.is_file():
        raise RuntimeFailed(RuntimeFailure.BINARY_MISSING, f"{binary} does not exist")
    if sha256_of(binary) != spec.binary_sha256:
        raise RuntimeFailed(
            RuntimeFailure.BINARY_DIGEST_MISMATCH, "the binary is not the environment's"
        )
    files = [VerifiedFile(path=spec.artifact_path, sha256=spec.artifact_digest)]
    files += [spec.draft_model] if spec.draft_model else []
    files += spec.loras
    for file in files:
        path = model_file(file.path, roots)
        if sha256_of(path) != file.sha256:
            raise RuntimeFailed(RuntimeFailure.ARTIFACT_DIGEST_MISMATCH, f"{path}: digest differs")


async def admitted_model(
    spec: LeasedFiles,
    config: RuntimeConfig,
    model_id: str,
    *,
    alias: str | None = None,
    endpoints: list[Endpoint] | None = None,
) -> ModelSpec:
    """The lease's model, once its settings are admitted and its files verified: what a
    device's server is started with (`alias`: the name it answers under; `endpoints`:
    what it serves, the default ones when None)."""
    settings = admitted_settings(spec)
    await asyncio.to_thread(verify_files, spec, config.llama_server_path, config.artifact_roots)
    return ModelSpec(
        model_id=model_id,
        alias=alias,
        path=Path(spec.artifact_path),
        server_args=settings.server_args,
        draft_model=Path(spec.draft_model.path) if spec.draft_model else None,
        loras=[LoraFile(path=Path(lora.path), scale=lora.scale) for lora in spec.loras],
        endpoints=endpoints if endpoints is not None else default_endpoints(),
        **settings.model_dump(include=set(LlamaTuning.model_fields)),
    )


def server_failure(exc: ServerFailed) -> RuntimeFailed:
    """A server that could not be made ready, as a runtime job's failure: its own code
    when it is a runtime failure's, else internal (the worker stopping: another attempt
    may well run elsewhere, or after the restart)."""
    known = exc.code in {failure.value for failure in RuntimeFailure}
    return RuntimeFailed(RuntimeFailure(exc.code) if known else RuntimeFailure.INTERNAL, exc.detail)


def model_file(named: str, roots: list[Path]) -> Path:
    """A file the lease names, if it may be loaded: an absolute path without `..`, a
    regular file (not a link, a device or a FIFO), inside one of the worker's
    `artifact_roots` (none: nothing is loaded for the control plane). The control plane
    resolved it from the node's artifact inventory; the node does not take its word for
    where that is."""
    if not roots:
        # Without roots any file the worker can read could be named (and its digest
        # compared): the worker loads nothing for the control plane then.
        raise RuntimeFailed(
            RuntimeFailure.ARTIFACT_MISSING, "the runtime worker has no artifact_roots"
        )
    path = Path(named)
    if not path.is_absolute() or ".." in path.parts:
        raise RuntimeFailed(
            RuntimeFailure.ARTIFACT_MISSING, f"{named} is not an absolute, plain path"
        )
    try:
        mode = path.lstat().st_mode
    except OSError:
        raise RuntimeFailed(RuntimeFailure.ARTIFACT_MISSING, f"{path} does not exist") from None
    if not stat.S_ISREG(mode):
        raise RuntimeFailed(RuntimeFailure.ARTIFACT_MISSING, f"{path} is not a regular file")
    resolved = path.resolve()
    if not any(resolved.is_relative_to(root.resolve()) for root in roots):
        raise RuntimeFailed(
            RuntimeFailure.ARTIFACT_MISSING, f"{path} is outside the artifact roots"
        )
    return path
