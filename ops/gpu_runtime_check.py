"""GPU check of the runtime worker: build llama-server with CUDA, run the cuda backend
with NVML metrics, load the test model on each GPU and probe it.

    python ops/gpu_runtime_check.py

Prints one JSON document per GPU: the device as the cuda backend sees it (UUID, memory
from NVML), the load time, the answer and its timings, VRAM used while loaded, and the
settle time after the unload (NVML showing the memory freed). Where no NVIDIA GPU (or no
driver) is present it says so on stderr and exits 2; a failed build or probe exits 1.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.runtime.backends import UnsupportedBackend  # noqa: E402
from agent.runtime.backends.cuda import CudaBackend  # noqa: E402
from agent.runtime.config import ModelSpec  # noqa: E402
from agent.runtime.devices import DeviceSlot, SlotSettings  # noqa: E402
from agent.runtime.server import ServerFailed, ServerSettings  # noqa: E402


def _built(*flags: str) -> Path:
    result = subprocess.run(
        [sys.executable, str(ROOT / "ops/llama/build.py"), *flags],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise SystemExit(f"gpu runtime check: build {flags} failed:\n{result.stderr[-3000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


async def check(binary: Path, model: Path, backend: CudaBackend) -> list[dict[str, object]]:
    results: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="mf-gpu-check-") as run_dir:
        settings = SlotSettings(
            binary=binary, run_dir=Path(run_dir),
            server=ServerSettings(startup_timeout_s=60, startup_cap_s=600,
                                  probe_interval_s=0.1, stop_grace_s=10),
            max_pending=2, settle_timeout_s=30,
        )  # fmt: skip
        for device in backend.devices():
            slot = DeviceSlot(device, backend, settings)
            spec = ModelSpec(model_id="smol", path=model, gpu_layers=99, ctx_size=2048)
            before = backend.metrics(device)
            try:
                async with slot.serving(spec) as server:
                    loaded = backend.metrics(device)
                    started = time.monotonic()
                    response = await server.http.post(
                        "/v1/chat/completions",
                        json={"model": "smol", "max_tokens": 16, "temperature": 0,
                              "messages": [{"role": "user", "content": "Say hello."}]},
                        timeout=120,
                    )  # fmt: skip
                    answer = response.json()
                    took = time.monotonic() - started
                    load_s = server.load_s
                settle_s = await slot.unload()
            except ServerFailed as exc:
                results.append({"device": device.id, "failed": exc.code, "detail": exc.detail})
                continue
            finally:
                await slot.close()
            used = (
                (loaded.memory_total_bytes or 0) - (loaded.memory_free_bytes or 0)
                if loaded.memory_free_bytes is not None else None
            )  # fmt: skip
            results.append({
                "device": device.id, "uuid": device.uuid, "name": device.name,
                "memory_total_bytes": device.memory_total_bytes,
                "memory_free_before_bytes": before.memory_free_bytes,
                "vram_used_while_loaded_bytes": used,
                "load_s": load_s, "request_s": round(took, 3),
                "answer": answer["choices"][0]["message"]["content"],
                "timings": answer.get("timings"), "settle_s": settle_s,
            })  # fmt: skip
    return results


def main() -> int:
    backend = CudaBackend()
    try:
        backend.devices()
    except UnsupportedBackend as exc:
        print(f"gpu runtime check: no NVIDIA GPU to check here ({exc})", file=sys.stderr)
        return 2
    binary, model = _built("--cuda"), _built("--model")
    try:
        results = asyncio.run(check(binary, model, backend))
    finally:
        backend.close()
    print(json.dumps(results, indent=2))
    return 1 if any("failed" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
