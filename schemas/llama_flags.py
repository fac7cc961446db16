"""Which llama-server flags may reach a node, and how: the allow-list of a RuntimeProfile's
`server_args`, and the families that are refused.

The node is a trust boundary. A profile comes from the control plane, and llama-server
has flags that run commands (its agent, tools and MCP servers), read or write files,
reach the network or serve a web UI. A deny-list of what we thought of let one of them
through, so a profile may carry only what `ALLOWED` names, each with its type and
bounds; everything else is refused at the API (422) and, again, by the runtime worker
before it builds argv (`profile_refused`). Where a path is needed (a draft model, a
LoRA), a profile names an artifact instead (schemas/runtime.py), resolved on the node
to a verified file.

`REFUSED` names every other flag of the llama-server we build, by family. A test reads
the built binary's `--help` and fails on a flag that is in neither table, so an upgrade
cannot add a flag that passes unexamined. The node's own operator may set the refused
flags in the local YAML, except the `LOCAL_REFUSED` families (and the managed ones).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from schemas.llama_flag_types import (
    CACHE_TYPES,
    MILLION,
    NGRAM,
    ON_OFF,
    ON_OFF_AUTO,
    PENALTY,
    PROBABILITY,
    SWITCH,
    THREADS,
    TOKEN_COUNT,
    TOKEN_COUNT_OR_ALL,
    ArgType,
    Choice,
    Real,
    Whole,
)

# The flags a RuntimeProfile may carry, by the one spelling the wire accepts (the long
# name, without dashes). Only tuning of the server's own compute: sampling defaults,
# batching, caches, context extension, offload, speculative decoding's numbers.
ALLOWED: Final[Mapping[str, ArgType]] = {
    # batching and slots
    "parallel": Whole(-1, 256),
    "cont-batching": SWITCH,
    "no-cont-batching": SWITCH,
    "n-predict": TOKEN_COUNT_OR_ALL,
    "keep": TOKEN_COUNT_OR_ALL,
    "threads-http": THREADS,
    "timeout": Whole(1, 86_400),
    "sse-ping-interval": Whole(-1, 3_600),
    "sleep-idle-seconds": Whole(-1, 7 * 86_400),
    "slot-prompt-similarity": PROBABILITY,
    "poll": Whole(0, 100),
    "poll-batch": Whole(0, 1),
    # KV cache and prompt cache
    "cache-type-k": CACHE_TYPES,
    "cache-type-v": CACHE_TYPES,
    "defrag-thold": Real(-1.0, 1.0),
    "kv-offload": SWITCH,
    "no-kv-offload": SWITCH,
    "kv-unified": SWITCH,
    "no-kv-unified": SWITCH,
    "kv-unified-per-slot": Whole(-1, 256),
    "swa-full": SWITCH,
    "ctx-checkpoints": Whole(0, 1024),
    "checkpoint-min-step": TOKEN_COUNT,
    "cache-ram": Whole(-1, 16 * MILLION),
    "cache-idle-slots": SWITCH,
    "no-cache-idle-slots": SWITCH,
    "cache-prompt": SWITCH,
    "no-cache-prompt": SWITCH,
    "cache-reuse": TOKEN_COUNT,
    "context-shift": SWITCH,
    "no-context-shift": SWITCH,
    # model loading and placement (the device itself is the runtime worker's)
    "load-mode": Choice(("auto", "none", "mmap", "mlock", "mmap+mlock", "dio")),
    "lazy-mode": ON_OFF_AUTO,
    "numa": Choice(("distribute", "isolate", "numactl")),
    "split-mode": Choice(("none", "layer", "row", "tensor")),
    "cpu-moe": SWITCH,
    "n-cpu-moe": Whole(0, 100_000),
    "n-cpu-ffn": Whole(0, 100_000),
    "fit": ON_OFF,
    "fit-ctx": TOKEN_COUNT,
    "check-tensors": SWITCH,
    "op-offload": SWITCH,
    "no-op-offload": SWITCH,
    "repack": SWITCH,
    "no-repack": SWITCH,
    "no-host": SWITCH,
    "warmup": SWITCH,
    "no-warmup": SWITCH,
    "offline": SWITCH,
    # context extension
    "rope-scaling": Choice(("none", "linear", "yarn")),
    "rope-scale": Real(0.0, 1_000.0),
    "rope-freq-base": Real(0.0, 1e9),
    "rope-freq-scale": Real(0.0, 1_000.0),
    "yarn-orig-ctx": TOKEN_COUNT,
    "yarn-ext-factor": Real(-1.0, 100.0),
    "yarn-attn-factor": Real(-1.0, 100.0),
    "yarn-beta-slow": Real(-1.0, 1_000.0),
    "yarn-beta-fast": Real(-1.0, 1_000.0),
    # sampling defaults (a request may still set its own)
    "seed": Whole(-1, 2**32 - 1),
    "temp": Real(0.0, 100.0),
    "top-k": TOKEN_COUNT,
    "top-p": PROBABILITY,
    "min-p": PROBABILITY,
    "top-nsigma": Real(-1.0, 100.0),
    "xtc-probability": PROBABILITY,
    "xtc-threshold": PROBABILITY,
    "typical": PROBABILITY,
    "repeat-last-n": TOKEN_COUNT,
    "repeat-penalty": Real(0.01, 100.0),
    "presence-penalty": PENALTY,
    "frequency-penalty": PENALTY,
    "dry-multiplier": Real(0.0, 100.0),
    "dry-base": Real(0.0, 100.0),
    "dry-allowed-length": TOKEN_COUNT,
    "dry-penalty-last-n": TOKEN_COUNT,
    "adaptive-target": Real(-1.0, 1.0),
    "adaptive-decay": Real(0.0, 1.0),
    "dynatemp-range": Real(0.0, 100.0),
    "dynatemp-exp": Real(0.0, 100.0),
    "mirostat": Whole(0, 2),
    "mirostat-lr": Real(0.0, 10.0),
    "mirostat-ent": Real(0.0, 100.0),
    "ignore-eos": SWITCH,
    "backend-sampling": SWITCH,
    "special": SWITCH,
    "escape": SWITCH,
    "no-escape": SWITCH,
    "spm-infill": SWITCH,
    "perf": SWITCH,
    "no-perf": SWITCH,
    # what the server computes (whether it serves embeddings is the deployment's
    # `endpoints`, a managed flag; how it pools them is the profile's)
    "pooling": Choice(("none", "mean", "cls", "last", "rank")),
    "embd-normalize": Whole(-1, 100),
    "lora-init-without-apply": SWITCH,
    # chat templates: the model's own, never template text
    "jinja": SWITCH,
    "reasoning-format": Choice(("none", "deepseek", "deepseek-legacy", "auto")),
    "reasoning": ON_OFF_AUTO,
    "reasoning-effort": Choice(("default", "minimal", "low", "medium", "high", "xhigh", "max")),
    "reasoning-budget": TOKEN_COUNT_OR_ALL,
    "reasoning-preserve": SWITCH,
    "no-reasoning-preserve": SWITCH,
    "skip-chat-parsing": SWITCH,
    "no-skip-chat-parsing": SWITCH,
    "prefill-assistant": SWITCH,
    "no-prefill-assistant": SWITCH,
    # multimodal numbers (the projector itself is a file: refused)
    "mmproj-offload": SWITCH,
    "no-mmproj-offload": SWITCH,
    "image-min-tokens": TOKEN_COUNT,
    "image-max-tokens": TOKEN_COUNT,
    "mtmd-batch-max-tokens": TOKEN_COUNT,
    "video-fps": Real(0.0, 1_000.0),
    "video-timestamp-interval": Whole(0, 3_600_000),
    # logging to the server's own log (never request bodies: `verbose` is refused)
    "log-disable": SWITCH,
    "log-colors": ON_OFF_AUTO,
    "log-prefix": SWITCH,
    "log-timestamps": SWITCH,
    "no-log-prefix": SWITCH,
    "no-log-timestamps": SWITCH,
    "no-log-jsonl": SWITCH,
    "verbosity": Whole(0, 3),
    # speculative decoding's numbers (the draft model is an artifact: `draft_model`)
    "draft-p-min": PROBABILITY,
    "draft-p-split": PROBABILITY,
    "spec-draft-n-max": TOKEN_COUNT,
    "spec-draft-n-min": TOKEN_COUNT,
    "threads-draft": THREADS,
    "threads-batch-draft": THREADS,
    "gpu-layers-draft": Whole(-1, 100_000),
    "cache-type-k-draft": CACHE_TYPES,
    "cache-type-v-draft": CACHE_TYPES,
    "cpu-moe-draft": SWITCH,
    "n-cpu-moe-draft": Whole(0, 100_000),
    "spec-draft-backend-sampling": SWITCH,
    "no-spec-draft-backend-sampling": SWITCH,
    "spec-synth-len": TOKEN_COUNT,
    "spec-ngram-mod-n-min": Whole(0, 1024),
    "spec-ngram-mod-n-max": Whole(0, 1024),
    "spec-ngram-mod-n-match": NGRAM,
    "spec-ngram-simple-size-n": NGRAM,
    "spec-ngram-simple-size-m": NGRAM,
    "spec-ngram-simple-min-hits": NGRAM,
    "spec-ngram-map-k-size-n": NGRAM,
    "spec-ngram-map-k-size-m": NGRAM,
    "spec-ngram-map-k-min-hits": NGRAM,
    "spec-ngram-map-k4v-size-n": NGRAM,
    "spec-ngram-map-k4v-size-m": NGRAM,
    "spec-ngram-map-k4v-min-hits": NGRAM,
}


class Family(StrEnum):
    """Why a flag is refused from the control plane."""

    # Set by the runtime worker or by a structured field (where it listens, what it
    # loads, which device, the typed settings).
    MANAGED = "managed"
    # Runs tools or commands, an agent, MCP servers, or serves the web UI and its
    # proxies: never, not even from the node's own config.
    TOOLS = "tools"
    # Reads or writes a file or a directory (a draft model or LoRA is an artifact).
    FILES = "files"
    # Fetches from, connects to or opens up to the network.
    NETWORK = "network"
    # A key or certificate.
    SECRETS = "secrets"
    # Free text the server interprets: templates, grammars, prompts, patterns.
    TEXT = "text"
    # The host's scheduling (CPU affinity, priority): the node's own business.
    HOST = "host"
    # Prints something and exits instead of serving.
    ACTION = "action"
    # Logs request and response bodies.
    BODIES = "bodies"
    # Removed from llama.cpp (still in --help): the server would refuse to start.
    REMOVED = "removed"


def _family(family: Family, *names: str) -> dict[str, Family]:
    return dict.fromkeys(names, family)


# Every other flag of the llama-server we build, by every spelling, with its family.
REFUSED: Final[Mapping[str, Family]] = {
    **_family(
        Family.MANAGED,
        "m", "model", "a", "alias", "host", "port", "reuse-port", "path", "api-prefix",
        "dev", "device", "devd", "device-draft", "spec-draft-device", "list-devices",
        "mmdev", "mmproj-device",
        "c", "ctx-size", "b", "batch-size", "ub", "ubatch-size", "t", "threads",
        "tb", "threads-batch", "ngl", "gpu-layers", "n-gpu-layers", "mg", "main-gpu",
        "ts", "tensor-split", "fa", "flash-attn", "metrics", "props", "slots", "no-slots",
        "models-max", "models-autoload", "no-models-autoload", "spec-type",
        "lora", "lora-scaled", "md", "model-draft", "spec-draft-model",
        # the deployment's endpoints and chat template (tools need jinja)
        "embeddings", "embedding", "reranking", "rerank", "no-jinja",
    ),
    **_family(
        Family.TOOLS,
        "tools", "tools-runtime", "agent", "ag", "mcp-servers-config", "mcp-servers-json",
        "ui", "webui", "no-ui", "no-webui", "ui-config", "webui-config", "ui-config-file",
        "webui-config-file", "ui-mcp-proxy", "webui-mcp-proxy", "no-ui-mcp-proxy",
        "no-webui-mcp-proxy", "no-agent", "no-ag",
    ),
    **_family(
        Family.FILES,
        "lcs", "lookup-cache-static", "lcd", "lookup-cache-dynamic", "grammar-file",
        "jf", "json-schema-file", "mm", "mmproj", "video-ffmpeg-dir", "control-vector",
        "control-vector-scaled", "control-vector-layer-range", "chat-template-file",
        "slot-save-path", "media-path", "models-dir", "models-preset", "log-file",
        "log-prompts-dir", "ssl-key-file", "ssl-cert-file", "api-key-file",
    ),
    **_family(
        Family.NETWORK,
        "mu", "model-url", "hf", "hfr", "hf-repo", "hff", "hf-file", "hft", "hf-token",
        "dr", "docker-repo", "hfd", "hfrd",
        "hf-repo-draft", "spec-draft-hf", "mmu", "mmproj-url", "mmproj-auto",
        "no-mmproj-auto", "no-mmproj", "rpc", "cors-origins", "cors-methods",
        "cors-headers", "cors-credentials", "no-cors-credentials", "cl", "cache-list",
        "embd-gemma-default", "fim-qwen-1.5b-default", "fim-qwen-3b-default",
        "fim-qwen-7b-default", "fim-qwen-7b-spec", "fim-qwen-14b-spec",
        "fim-qwen-30b-default", "gpt-oss-20b-default", "gpt-oss-120b-default",
        "vision-gemma-4b-default", "vision-gemma-12b-default", "spec-default",
    ),
    **_family(Family.SECRETS, "api-key"),
    **_family(
        Family.TEXT,
        "r", "reverse-prompt", "samplers", "sampler-seq", "sampling-seq", "l", "logit-bias",
        "grammar", "j", "json-schema", "dry-sequence-breaker", "ot", "override-tensor",
        "otd", "override-tensor-draft", "spec-draft-override-tensor", "override-kv",
        "tags", "chat-template", "chat-template-kwargs", "reasoning-budget-message",
        "fitt", "fit-target", "spec-synth-rates",
    ),
    **_family(
        Family.HOST,
        "C", "cpu-mask", "Cr", "cpu-range", "cpu-strict", "prio", "Cb", "cpu-mask-batch",
        "Crb", "cpu-range-batch", "cpu-strict-batch", "prio-batch", "Cd", "cpu-mask-draft",
        "spec-draft-cpu-mask", "Crd", "cpu-range-draft", "spec-draft-cpu-range",
        "cpu-strict-draft", "spec-draft-cpu-strict", "prio-draft", "spec-draft-prio",
        "poll-draft", "spec-draft-poll", "Cbd", "cpu-mask-batch-draft",
        "spec-draft-cpu-mask-batch", "cpu-strict-batch-draft",
        "spec-draft-cpu-strict-batch", "prio-batch-draft", "spec-draft-prio-batch",
        "poll-batch-draft", "spec-draft-poll-batch",
    ),
    **_family(
        Family.ACTION, "h", "help", "usage", "version", "completion-bash",
    ),
    **_family(Family.BODIES, "v", "verbose", "log-verbose", "log-jsonl"),
    **_family(
        Family.REMOVED, "draft", "draft-n", "draft-max", "draft-min", "draft-n-min",
        "spec-ngram-size-n", "spec-ngram-size-m", "spec-ngram-min-hits",
    ),
}  # fmt: skip

# Other spellings of allowed flags. The wire takes one spelling per flag, so a profile
# reads the same wherever it is shown; these are refused with the one to use.
ALIASES: Final[Mapping[str, str]] = {
    "np": "parallel",
    "cb": "cont-batching",
    "nocb": "no-cont-batching",
    "n": "n-predict",
    "predict": "n-predict",
    "to": "timeout",
    "sps": "slot-prompt-similarity",
    "ctk": "cache-type-k",
    "ctv": "cache-type-v",
    "dt": "defrag-thold",
    "kvo": "kv-offload",
    "nkvo": "no-kv-offload",
    "kvu": "kv-unified",
    "no-kvu": "no-kv-unified",
    "nr": "no-repack",
    "ctxcp": "ctx-checkpoints",
    "swa-checkpoints": "ctx-checkpoints",
    "cms": "checkpoint-min-step",
    "cram": "cache-ram",
    "lm": "load-mode",
    "lzm": "lazy-mode",
    "sm": "split-mode",
    "cmoe": "cpu-moe",
    "ncmoe": "n-cpu-moe",
    "ncffn": "n-cpu-ffn",
    "fitc": "fit-ctx",
    "s": "seed",
    "temperature": "temp",
    "top-n-sigma": "top-nsigma",
    "typical-p": "typical",
    "bs": "backend-sampling",
    "sp": "special",
    "e": "escape",
    "rea": "reasoning",
    "lv": "verbosity",
    "log-verbosity": "verbosity",
    "spec-draft-p-min": "draft-p-min",
    "spec-draft-p-split": "draft-p-split",
    "td": "threads-draft",
    "spec-draft-threads": "threads-draft",
    "tbd": "threads-batch-draft",
    "spec-draft-threads-batch": "threads-batch-draft",
    "ngld": "gpu-layers-draft",
    "n-gpu-layers-draft": "gpu-layers-draft",
    "spec-draft-ngl": "gpu-layers-draft",
    "ctkd": "cache-type-k-draft",
    "spec-draft-type-k": "cache-type-k-draft",
    "ctvd": "cache-type-v-draft",
    "spec-draft-type-v": "cache-type-v-draft",
    "cmoed": "cpu-moe-draft",
    "spec-draft-cpu-moe": "cpu-moe-draft",
    "ncmoed": "n-cpu-moe-draft",
    "spec-draft-n-cpu-moe": "n-cpu-moe-draft",
    "spec-draft-ncmoe": "n-cpu-moe-draft",
}

# Refused in the node's own YAML too, however trusted its operator.
LOCAL_REFUSED: Final = frozenset({Family.MANAGED, Family.TOOLS})


@dataclass(frozen=True)
class FlagRefusal:
    """Why one `server_args` entry is refused: the flag, and a sentence."""

    flag: str
    reason: str


def profile_refusals(server_args: Mapping[str, object]) -> list[FlagRefusal]:
    """Every entry of a profile's `server_args` that the allow-list does not admit,
    with its value's type and bounds; empty when all pass."""
    refusals = []
    for flag, value in server_args.items():
        kind = ALLOWED.get(flag)
        if kind is None:
            refusals.append(FlagRefusal(flag, _not_allowed(flag)))
        elif (expected := kind.check(value)) is not None:
            refusals.append(FlagRefusal(flag, f"--{flag} takes {expected}"))
    return refusals


def local_refusals(server_args: Mapping[str, object]) -> list[FlagRefusal]:
    """The entries of a node's own YAML `server_args` that are refused even there: the
    managed and tool families, and a value that llama-server would read as a flag (each
    value is its own argv element, so `{"log-prefix": "--agent"}` would pass `--agent`
    after a flag that takes no value)."""
    refusals = []
    for flag, value in server_args.items():
        family = REFUSED.get(flag)
        if family in LOCAL_REFUSED:
            refusals.append(FlagRefusal(flag, _not_allowed(flag)))
        elif isinstance(value, str) and value.startswith("-") and not _is_number(value):
            refusals.append(FlagRefusal(flag, f"--{flag}: a value may not start with '-'"))
    return refusals


# The flag that gives each slot a KV buffer of its own, and why a load that serves
# embeddings may not set it (the runtime worker adds --kv-unified for such a load).
SPLIT_KV: Final = "no-kv-unified"
SPLIT_KV_REASON: Final = (
    "embeddings need the unified KV cache: with one per slot, an input batched with"
    " others gets another vector than alone"
)


def endpoint_refusals(
    server_args: Mapping[str, object], endpoints: Collection[str]
) -> list[FlagRefusal]:
    """The entries of a profile's `server_args` that the endpoints a load serves rule
    out: the API refuses them when a deployment or a service is declared, the runtime
    worker again before it starts llama-server."""
    if "embeddings" in endpoints and server_args.get(SPLIT_KV) is True:
        return [FlagRefusal(SPLIT_KV, f"--{SPLIT_KV}: {SPLIT_KV_REASON}")]
    return []


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _not_allowed(flag: str) -> str:
    if flag in ALIASES:
        return f"--{flag} is spelled {ALIASES[flag]} in server_args"
    family = REFUSED.get(flag)
    if family is Family.MANAGED:
        return f"--{flag} is set by the runtime worker or a structured field"
    if family is not None:
        return f"--{flag} is refused ({family.value})"
    return f"--{flag} is not an allowed llama-server flag"


def server_args_json_schema() -> dict[str, Any]:
    """The allow-list as JSON Schema: a client's validator and ours agree."""
    return {
        "type": "object",
        "properties": {name: kind.json_schema() for name, kind in ALLOWED.items()},
        "additionalProperties": False,
        "maxProperties": 64,
    }
