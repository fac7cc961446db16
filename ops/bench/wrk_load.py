"""A load generator that is not the bottleneck: Debian's `wrk` (C, epoll) with a Lua
script that cycles through every node's credential and body.

    apt-get install wrk

The Python generator of heartbeats.py competes for the same 2 cores as the server and
caps the baseline; wrk needs a fraction of one. Each wrk thread holds its own copy of the
requests and starts at a random node, so concurrent connections spread over the fleet.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LUA = r"""
local requests = {}
init = function(args)
  for line in io.lines(args[1]) do
    local credential, body = line:match("^(%S+) (.*)$")
    requests[#requests + 1] = wrk.format("POST", args[2], {
      ["Content-Type"] = "application/json",
      ["Authorization"] = "Bearer " .. credential,
    }, body)
  end
  math.randomseed(os.time() + tonumber(tostring({}):match("0x(%x+)"), 16) % 1000)
  counter = math.random(#requests)
end
request = function()
  counter = counter % #requests + 1
  return requests[counter]
end
"""

_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


@dataclass(frozen=True)
class WrkSummary:
    name: str
    throughput: float
    p50_s: float
    p99_s: float
    requests: int
    errors: int
    # wrk's mean latency: with a closed loop of N connections, N / mean is the rate
    # without the end of the round's cut (the requests in flight then are not counted).
    mean_s: float = float("nan")

    def line(self) -> str:
        return (
            f"{self.name:<10} {self.throughput:>10.0f}/s  p50 {self.p50_s * 1e3:7.2f} ms"
            f"  p99 {self.p99_s * 1e3:7.2f} ms  ok {self.requests - self.errors:>7}"
            f"  errors {self.errors}"
        )


def available() -> bool:
    return shutil.which("wrk") is not None


def _seconds(text: str) -> float:
    found = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
    if found is None:
        raise ValueError(f"unexpected wrk latency {text!r}")
    return float(found.group(1)) * _UNITS[found.group(2)]


def run(
    name: str,
    base_url: str,
    path: str,
    bodies: list[tuple[str, dict[str, Any]]],
    *,
    duration_s: float,
    connections: int,
    workdir: Path,
    threads: int = 2,
    timeout_s: float | None = None,
) -> WrkSummary:
    """POST (credential, body) pairs round-robin for duration_s; wrk's own summary.
    `timeout_s`: wrk's per-request timeout (its own default is 2 s, counted as errors)."""
    script = workdir / "requests.lua"
    script.write_text(LUA)
    lines = workdir / f"{name}.requests"
    lines.write_text(
        "".join(f"{cred} {json.dumps(body, separators=(',', ':'))}\n" for cred, body in bodies)
    )
    result = subprocess.run(
        [
            "wrk",
            f"-t{threads}",
            f"-c{connections}",
            f"-d{duration_s:g}s",
            "--latency",
            *([f"--timeout={timeout_s:g}s"] if timeout_s is not None else []),
            "-s",
            str(script),
            base_url,
            "--",
            str(lines),
            path,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=duration_s + 60 + (timeout_s or 0),
    )
    out = result.stdout
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out
    )
    errors = int(bad.group(1)) if bad else 0
    if socket_errors:
        errors += sum(int(g) for g in socket_errors.groups())
    p50 = _seconds(re.search(r"\n\s+50%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    p99 = _seconds(re.search(r"\n\s+99%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    mean = _seconds(re.search(r"Latency\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    return WrkSummary(name, rate, p50, p99, total, errors, mean)
