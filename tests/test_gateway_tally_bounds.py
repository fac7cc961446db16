"""What reading a node's plain answer for its usage costs the gateway
(api/gateway/tally.py: plain_usage): the answer may be 32 MiB (256 embeddings as JSON
floats are ~20 MB), and the node is outside the trust boundary, so its usage is found
without building the whole body as Python objects (pydantic's parser builds every value
of a key it then ignores: ~480 MiB and a blocked event loop for 32 MiB of floats)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from api.gateway.tally import plain_usage

pytestmark = pytest.mark.fast

USAGE = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}


def test_the_usage_of_each_endpoints_answer_is_read() -> None:
    # As llama-server 0.3.36 orders them: a completion's usage before id and timings,
    # embeddings' before data.
    completion = {
        "choices": [{"index": 0, "text": "usage", "finish_reason": "length"}],
        "created": 1, "model": "smol", "object": "text_completion",
        "usage": {**USAGE, "prompt_tokens_details": {"cached_tokens": 0}},
        "id": "c", "timings": {"predicted_n": 3},
    }  # fmt: skip
    assert plain_usage(json.dumps(completion).encode()) == (7, 3)
    vector = {"embedding": [0.5] * 8, "index": 0, "object": "embedding"}
    embeddings = {"model": "smol", "object": "list",
                  "usage": {"prompt_tokens": 4, "total_tokens": 4}, "data": [vector]}  # fmt: skip
    assert plain_usage(json.dumps(embeddings, separators=(",", ":")).encode()) == (4, 0)
    # The worker's merged list answer (agent/runtime/completion_list.py): usage last.
    merged = {"id": "c", "object": "text_completion", "choices": [], "usage": USAGE}
    assert plain_usage(json.dumps(merged, indent=2).encode()) == (7, 3)


@pytest.mark.parametrize(
    "body",
    [
        b'{"usage": null}',
        b'{"usage": {"prompt_tokens": 1.5, "completion_tokens": 2}}',
        b'{"usage": {"prompt_tokens": true, "completion_tokens": 2}}',
        b'{"usage": {"prompt_tokens": -1, "completion_tokens": 2}}',
        b'{"usage": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        b'{"usage": {"prompt_tokens": 1, "completion_tokens": 2',
        b'{"usage": "' + b"x" * 100_000 + b'"}',
        b'no json at all "usage"',
    ],
)
def test_a_usage_not_in_openais_shape_counts_nothing(body: bytes) -> None:
    assert plain_usage(body) == (0, 0)


@pytest.mark.parametrize("key", ["choices", "data"])
def test_a_32_mib_answer_is_read_for_its_usage_without_building_it(key: str) -> None:
    """In a process of its own: its peak memory is the body's and little more."""
    script = textwrap.dedent(f"""
        import resource
        from api.gateway.tally import plain_usage
        n = 16 * 1024 * 1024
        usage = b'"usage":{{"prompt_tokens":1,"completion_tokens":2}}}}'
        body = b'{{"{key}":[' + b"0," * (n - 1) + b'0],' + usage
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        assert plain_usage(body) == (1, 2)
        print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
    """)
    ran = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert ran.returncode == 0, ran.stderr
    grown_mib = int(ran.stdout.strip())
    assert grown_mib < 64, f"reading the usage grew the process by {grown_mib} MiB"
