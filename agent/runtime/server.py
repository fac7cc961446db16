"""One llama-server process: its argv from the typed model config, its start in a process
group of its own, readiness, layered health, and its stop.

* **Loopback only.** The server is bound to 127.0.0.1 whatever the config says (the
  host flag is the worker's, never `server_args`'); the local API is what others reach.
* **Readiness** is `/health` 200, the model listed in `/v1/models`, then a one-token
  warm-up. The startup timeout is progress-aware: while the server shows progress (its
  log grows, it spends CPU time, its resident memory grows) the timeout starts again,
  up to a hard cap. This llama-server logs only a few lines while loading, so the log
  alone would not do.
* **Only the worker may call it.** Loopback is shared with every local user and process
  of the node; each start gets a fresh random key (a 0600 file beside the log, handed to
  llama-server by `--api-key-file`, never on argv where `ps` shows it), and the worker
  sends it on every request. Without it a local process could bypass the worker's
  backpressure and device accounting, or read other clients' prompts from `/slots`.
* **Stop**: SIGTERM to the group, SIGKILL after the grace period (agent/processes.py).
  A pidfile per device names the process and its start time, so a runtime worker that
  was SIGKILLed reaps its leftover servers when it starts again (`reap_leftovers`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import httpx
import psutil

from agent.processes import start_process, stop_process
from agent.runtime.backends import DeviceRef
from agent.runtime.config import ModelSpec
from schemas.endpoints import ChatTemplateCaps, Endpoint
from schemas.llama_flags import endpoint_refusals, local_refusals
from schemas.runtime import ChatTemplate, RuntimeFailure

logger = logging.getLogger("modelforge.runtime.server")

LOOPBACK = "127.0.0.1"
# The chat templates this worker ships (package data), by the name a profile gives.
TEMPLATES = Path(__file__).with_name("templates")
# What llama-server answers an embeddings request when the model pools nothing.
_NO_POOLING = "Pooling type 'none'"
# What llama.cpp prints when an allocation fails (CPU or GPU).
_OOM_MARKS = ("out of memory", "failed to allocate", "cudaMalloc failed", "unable to allocate")


class ServerFailed(Exception):
    """The server could not be made ready; `code` is the runtime failure code."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


@dataclass(frozen=True)
class ServerSettings:
    startup_timeout_s: float
    startup_cap_s: float
    probe_interval_s: float
    stop_grace_s: float


@dataclass(frozen=True)
class Health:
    process_up: bool
    health_ok: bool
    model_listed: bool

    @property
    def ready(self) -> bool:
        return self.process_up and self.health_ok and self.model_listed


def server_argv(
    binary: Path, model: ModelSpec, port: int, *, key_file: Path | None = None
) -> list[str]:
    """The complete argv: fixed loopback binding (and the worker's own key, when given),
    then the typed fields, then the typed escape hatch. Each value is one argv element;
    nothing passes through a shell."""
    argv = [str(binary), "--model", str(model.path), "--host", LOOPBACK, "--port", str(port)]
    if key_file is not None:
        argv += ["--api-key-file", str(key_file)]
    argv += ["--alias", model.served_name]
    numeric = {
        "--ctx-size": model.ctx_size,
        "--batch-size": model.batch_size,
        "--ubatch-size": model.ubatch_size,
        "--threads": model.threads,
        "--threads-batch": model.threads_batch,
        "--n-gpu-layers": model.gpu_layers,
        "--main-gpu": model.main_gpu,
    }
    for flag, value in numeric.items():
        if value is not None:
            argv += [flag, str(value)]
    if model.tensor_split is not None:
        argv += ["--tensor-split", ",".join(f"{share:g}" for share in model.tensor_split)]
    if model.flash_attn is not None:
        argv += ["--flash-attn", "on" if model.flash_attn else "off"]
    # Managed: what it serves and its chat template are the deployment's and the
    # profile's typed fields, never server_args (schemas/llama_flags.py).
    if "embeddings" in model.endpoints:
        # One KV buffer for all slots: with one per slot (what an explicit `parallel`
        # turns on) llama.cpp splits a batch of several inputs into equal-length
        # sub-batches, and an input longer than the shortest one beside it is, as far as
        # the source reads, pooled from a piece of it: cosine 0.65 to the same text alone
        # (0.3.36, SmolLM2, mean; --parallel 1 or --kv-unified: 1.0000000).
        argv += ["--embeddings", "--kv-unified"]
    if model.chat_template != "model":
        argv += ["--chat-template-file", str(template_file(model.chat_template))]
    if model.draft_model is not None:
        argv += ["--model-draft", str(model.draft_model)]
    for lora in model.loras:
        argv += ["--lora-scaled", f"{lora.path}:{lora.scale:g}"]
    # Checked again here, whatever built the spec: the node's own refusals hold for
    # every argv this worker starts (a probe's settings passed the allow-list too).
    refusals = local_refusals(model.server_args)
    refusals += endpoint_refusals(model.server_args, model.endpoints)
    if refusals:
        raise ServerFailed("profile_refused", "; ".join(r.reason for r in refusals))
    for name, arg in model.server_args.items():
        if arg is True:
            argv.append(f"--{name}")
        elif arg is not False:
            argv += [f"--{name}", str(arg)]
    return argv


def template_file(name: ChatTemplate) -> Path:
    """The shipped template of that name (a name from a typed field: never a path)."""
    path = TEMPLATES / f"{name}.jinja"
    if not path.is_file():
        raise ServerFailed(RuntimeFailure.INTERNAL.value, f"the {name} template is not installed")
    return path


def endpoint_request(endpoint: Endpoint, model: str, content: str) -> tuple[str, dict[str, object]]:
    """The smallest request to one endpoint: its path and body."""
    if endpoint == "chat":
        messages = [{"role": "user", "content": content}]
        return "/v1/chat/completions", {"model": model, "messages": messages, "max_tokens": 1}
    if endpoint == "completions":
        return "/v1/completions", {"model": model, "prompt": content, "max_tokens": 1}
    return "/v1/embeddings", {"model": model, "input": content}


def child_environment(inherited: Mapping[str, str]) -> dict[str, str]:
    """The worker's environment for llama-server, less what would reach around argv:
    llama.cpp reads every flag from a `LLAMA_ARG_*` variable too (`--tools` from
    LLAMA_ARG_TOOLS), and more of its own (LLAMA_API_KEY, LLAMA_APP_CMD, HF_TOKEN,
    MTMD_*); the device pinning is the backend's (CUDA_*)."""
    return {
        key: value for key, value in inherited.items() if not key.upper().startswith(_NOT_INHERITED)
    }


_NOT_INHERITED = ("CUDA_", "LLAMA", "HF_", "MTMD_", "LLGUIDANCE")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        port: int = probe.getsockname()[1]
        return port


class LlamaServer:
    def __init__(
        self,
        binary: Path,
        model: ModelSpec,
        device: DeviceRef,
        environment: dict[str, str],
        run_dir: Path,
        settings: ServerSettings,
    ) -> None:
        self.binary = binary
        self.model = model
        self.device = device
        self.settings = settings
        self.port = free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        name = device.id.replace(":", "-")
        self.log_path = run_dir / f"llama-server-{name}.log"
        self.pidfile = run_dir / f"llama-server-{name}.json"
        self.key_file = run_dir / f"llama-server-{name}.key"
        self._key = secrets.token_urlsafe(32)
        self._environment = environment
        self._process: subprocess.Popen[bytes] | None = None
        self.load_s: float | None = None
        # The local API relays requests with aiohttp (the proxy's hot path: a third of
        # httpx's cost per request, ops/bench/runtime.py); control calls use httpx.
        self._relay: aiohttp.ClientSession | None = None
        # Responses being relayed: a stop ends their reads (closing the session alone
        # leaves a streamed body's reader waiting for ever).
        self._relayed: weakref.WeakSet[aiohttp.ClientResponse] = weakref.WeakSet()
        self.http = httpx.AsyncClient(
            base_url=self.url,
            timeout=httpx.Timeout(10.0, read=None),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
            trust_env=False,  # loopback: never through a proxy
            headers=self._auth,
        )

    @property
    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._key}"}

    async def post_relayed(self, path: str, data: bytes) -> aiohttp.ClientResponse:
        """POST a JSON body to llama-server for a client; its answer is read by the
        caller, and ended with an error if this server is stopped first.

        On a connection of its own (Connection: close): llama-server may close a
        kept-alive connection just as it is reused, and the request then fails without
        having been asked (ServerDisconnectedError)."""
        headers = {"Content-Type": "application/json", "Connection": "close", **self._auth}
        response = await self.relay.post(path, data=data, headers=headers)
        self._relayed.add(response)
        return response

    @property
    def relay(self) -> aiohttp.ClientSession:
        if self._relay is None:
            self._relay = aiohttp.ClientSession(
                base_url=self.url,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                auto_decompress=False,
                connector=aiohttp.TCPConnector(limit=64),
            )
        return self._relay

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    async def start(self) -> float:
        """Start the process and wait until it is ready; the load time in seconds."""
        if not self.binary.is_file() or not os.access(self.binary, os.X_OK):
            raise ServerFailed("binary_missing", f"{self.binary} is not an executable file")
        if not self.model.path.is_file():
            raise ServerFailed("artifact_missing", f"{self.model.path} is not a file")
        env = child_environment(os.environ)
        env.update(self._environment)
        write_key(self.key_file, self._key)
        argv = server_argv(self.binary, self.model, self.port, key_file=self.key_file)
        self.log_path.write_bytes(b"")  # this start's log only
        started = time.monotonic()
        # Dies with the worker, however the worker dies: a SIGKILLed worker must not
        # leave a server holding the device's memory. (Started from the event loop's
        # thread, which lives as long as the worker: the signal follows that thread.)
        self._process = start_process(
            argv, log_path=self.log_path, env=env, parent_death_signal=signal.SIGKILL
        )
        write_pidfile(self.pidfile, self._process.pid, self.binary, self.port)
        logger.info(
            "llama-server for %s on %s started (pid %d, port %d)",
            self.model.model_id,
            self.device.id,
            self._process.pid,
            self.port,
        )
        try:
            await self._wait_ready(started)
        except BaseException:
            await self.stop()
            raise
        self.load_s = time.monotonic() - started
        logger.info(
            "llama-server for %s on %s ready in %.2f s",
            self.model.model_id,
            self.device.id,
            self.load_s,
        )
        return self.load_s

    async def _wait_ready(self, started: float) -> None:
        timeout, cap = self.settings.startup_timeout_s, self.settings.startup_cap_s
        deadline = started + timeout
        seen: tuple[int, float, int] | None = None
        while True:
            if not self.alive:
                raise self._exited()
            if (await self.health()).ready:
                break
            now = time.monotonic()
            mark = self._progress_mark()
            if mark != seen:  # the load is still getting somewhere
                seen = mark
                deadline = now + timeout
            if now >= min(deadline, started + cap):
                raise ServerFailed(
                    "startup_timeout",
                    f"{self.model.model_id} was not ready after {now - started:.1f} s",
                )
            await asyncio.sleep(self.settings.probe_interval_s)
        await self._warm_up()

    async def one_token(
        self, content: str = "hi", endpoint: Endpoint | None = None
    ) -> httpx.Response:
        """A one-token request to an endpoint it serves (the first, by default: chat
        when it serves chat): the warm-up, and a health check's inference."""
        path, body = endpoint_request(
            endpoint or self.model.endpoints[0], self.model.served_name, content
        )
        return await self.http.post(path, json=body, timeout=60)

    async def _warm_up(self) -> None:
        """Every endpoint it serves answers once, so one that cannot fails the load
        with why, not the first client's request."""
        for endpoint in self.model.endpoints:
            try:
                response = await self.one_token(endpoint=endpoint)
            except httpx.HTTPError as exc:
                raise (
                    self._exited()
                    if not self.alive
                    else ServerFailed(
                        "inference_failed", f"warm-up ({endpoint}): {type(exc).__name__}"
                    )
                ) from None
            if response.status_code == 200:
                continue
            if endpoint == "embeddings" and _NO_POOLING in response.text:
                raise ServerFailed(
                    RuntimeFailure.EMBEDDINGS_UNAVAILABLE.value,
                    "the model pools no embeddings: set pooling in the profile"
                    " (server_args pooling: mean, cls or last)",
                )
            raise ServerFailed(
                "inference_failed", f"warm-up ({endpoint}) answered {response.status_code}"
            )

    async def template_caps(self) -> ChatTemplateCaps | None:
        """What its chat template can do, from `/props` (None: it did not say)."""
        try:
            response = await self.http.get("/props", timeout=10)
            return ChatTemplateCaps.from_props(response.json()) if response.is_success else None
        except (httpx.HTTPError, ValueError):
            return None

    async def health(self) -> Health:
        if not self.alive:
            return Health(process_up=False, health_ok=False, model_listed=False)
        try:
            health = await self.http.get("/health", timeout=2)
            if health.status_code != 200:
                return Health(process_up=True, health_ok=False, model_listed=False)
            models = await self.http.get("/v1/models", timeout=2)
            listed = models.status_code == 200 and self.model.served_name in _model_ids(models)
        except httpx.HTTPError:
            return Health(process_up=True, health_ok=False, model_listed=False)
        return Health(process_up=True, health_ok=True, model_listed=listed)

    def _progress_mark(self) -> tuple[int, float, int]:
        """What changes while a load makes progress: the log (llama.cpp reports some
        steps there), the CPU time it spends and the memory it maps in. A server stuck
        waiting on something changes none of them."""
        try:
            process = psutil.Process(self.pid or -1)
            times = process.cpu_times()
            cpu, rss = round(times.user + times.system, 2), process.memory_info().rss
        except psutil.Error:
            cpu, rss = 0.0, 0
        return _size(self.log_path), cpu, rss

    def _exited(self) -> ServerFailed:
        code = self._process.poll() if self._process is not None else None
        tail = _tail(self.log_path)
        if any(mark in tail.lower() for mark in _OOM_MARKS):
            return ServerFailed("out_of_memory", f"llama-server ran out of memory (exit {code})")
        return ServerFailed("process_exited", f"llama-server exited with status {code}")

    async def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            grace = self.settings.stop_grace_s
            await asyncio.to_thread(stop_process, process, timeout_s=grace)
            logger.info("llama-server for %s on %s stopped", self.model.model_id, self.device.id)
        self.pidfile.unlink(missing_ok=True)
        self.key_file.unlink(missing_ok=True)

    async def close(self) -> None:
        # The relayed requests first: whoever still waits on this server gets its error
        # now, not once the process has stopped (llama-server may take its stop grace
        # with a request in flight).
        for response in list(self._relayed):
            if not response.closed:
                response.content.set_exception(
                    aiohttp.ClientConnectionError("llama-server was stopped")
                )
                response.close()
        if self._relay is not None:
            await self._relay.close()
        await self.stop()
        await self.http.aclose()


def _model_ids(response: httpx.Response) -> set[str]:
    try:
        return {str(m.get("id")) for m in response.json().get("data", [])}
    except (ValueError, AttributeError):
        return set()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _tail(path: Path, size: int = 8192) -> str:
    try:
        with path.open("rb") as log:
            log.seek(max(0, _size(path) - size))
            return log.read().decode(errors="replace")
    except OSError:
        return ""


# ------------------------------------------------------------------ leftovers


def write_key(path: Path, key: str) -> None:
    """The key, readable by this user only from its first byte (never a chmod after the
    write); a planted link in its place is refused, not followed."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a file left by an earlier worker may have looser rights
    fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(key)


def write_pidfile(path: Path, pid: int, binary: Path, port: int) -> None:
    created = psutil.Process(pid).create_time()
    staged = path.with_suffix(".tmp")
    record = {"pid": pid, "create_time": created, "binary": str(binary), "port": port}
    staged.write_text(json.dumps(record))
    os.replace(staged, path)


def reap_leftovers(run_dir: Path) -> int:
    """Stop the servers an earlier run of this worker left behind; how many there were.
    A pidfile's process is ours only if its start time and binary still match (a pid
    can have been reused)."""
    reaped = 0
    for pidfile in run_dir.glob("llama-server-*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError, psutil.Error):
            recorded = json.loads(pidfile.read_text())
            process = psutil.Process(int(recorded["pid"]))
            same = abs(process.create_time() - float(recorded["create_time"])) < 0.01
            if same and process.exe() == str(Path(recorded["binary"]).resolve()):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGTERM)
                _, alive = psutil.wait_procs([process], timeout=10)
                for leftover in alive:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(leftover.pid, signal.SIGKILL)
                reaped += 1
                logger.warning("reaped a leftover llama-server (pid %d)", process.pid)
        pidfile.unlink(missing_ok=True)
    return reaped
