"""A paced fleet from `wrk`: every node's requests at the real cadence, from a load
generator that costs a few percent of one core.

    apt-get install wrk

wrk is closed-loop by itself; a Lua `delay()` turns it into a schedule. Each wrk thread
owns a share of the nodes and hands out send slots spaced `interval / nodes` apart on the
wall clock (LuaJIT's ffi reads gettimeofday), so node j of a thread is sent at
`start + k * interval + j * spacing`: one request per node per interval, as real agents
send them. When every connection is busy the schedule slips (requests go out as soon as
a connection frees up), as late agents would. The first request of each connection goes
out at once (wrk sends it on connect), which is a burst the warm-up absorbs.

Each line of the requests file is `credential<TAB>body`, the body a Lua format string:
`%d` is replaced by a per-node sequence (an epoch-seconds base plus the cycle number,
so a later run never replays an earlier one's) and `%s` by the current UTC time.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

LUA = r"""
local ffi = require("ffi")
ffi.cdef[[
typedef struct { long tv_sec; long tv_usec; } mf_timeval;
int gettimeofday(mf_timeval *tv, void *tz);
]]
local tv = ffi.new("mf_timeval")
local function now_ms()
  ffi.C.gettimeofday(tv, nil)
  return tonumber(tv.tv_sec) * 1000 + tonumber(tv.tv_usec) / 1000
end

local threads_started = 0
setup = function(thread)
  thread:set("thread_index", threads_started)
  threads_started = threads_started + 1
end

local nodes = {}
local method, path, spacing_ms, start_ms, base
local scheduled, sent = 0, 0

init = function(args)
  path, method = args[2], args[3]
  local interval_ms = tonumber(args[4]) * 1000
  local threads, connections = tonumber(args[5]), tonumber(args[6])
  base = tonumber(args[7])
  local line_no = 0
  for line in io.lines(args[1]) do
    if line_no % threads == thread_index then
      local credential, body = line:match("^(%S+)\t(.*)$")
      nodes[#nodes + 1] = {["Authorization"] = "Bearer " .. credential, body = body}
    end
    line_no = line_no + 1
  end
  spacing_ms = interval_ms / #nodes
  start_ms = now_ms()
  -- Each connection's first request goes out on connect, without a delay() call.
  scheduled = math.ceil(connections / threads)
end

delay = function()
  local due = start_ms + scheduled * spacing_ms
  scheduled = scheduled + 1
  local wait = due - now_ms()
  if wait < 0 then return 0 end
  return math.floor(wait)
end

request = function()
  local node = nodes[sent % #nodes + 1]
  local cycle = math.floor(sent / #nodes)
  sent = sent + 1
  local body = string.format(node.body, base + cycle, os.date("!%Y-%m-%dT%H:%M:%SZ"))
  return wrk.format(method, path, {
    ["Content-Type"] = "application/json",
    ["Authorization"] = node["Authorization"],
  }, body)
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'MFRESULT {"requests": %d, "p50_us": %d, "p99_us": %d, "status": %d, "connect": %d,'
    .. ' "read": %d, "write": %d, "timeout": %d}\n',
    summary.requests, latency:percentile(50), latency:percentile(99), e.status, e.connect,
    e.read, e.write, e.timeout))
end
"""


@dataclass(frozen=True)
class PacedResult:
    requests: int
    p50_s: float
    p99_s: float
    errors: int
    # By kind (wrk's: status = a non-2xx answer; connect, read, write, timeout).
    kinds: dict[str, int]

    def described(self) -> str:
        return ", ".join(f"{kind} {count}" for kind, count in self.kinds.items() if count)


def requests_file(path: Path, lines: list[tuple[str, str]]) -> Path:
    """Write (credential, Lua body template) pairs."""
    path.write_text("".join(f"{credential}\t{body}\n" for credential, body in lines))
    return path


def template(body: dict[str, object], *, sequence: str = "", observed_at: str = "") -> str:
    """A JSON body as a Lua format string: the field named `sequence` becomes %d, the
    one named `observed_at` becomes "%s" (whatever values they hold here)."""
    text = json.dumps(body, separators=(",", ":")).replace("%", "%%")
    if sequence:
        text = re.sub(rf'"{sequence}":\d+', f'"{sequence}":%d', text)
    if observed_at:
        text = re.sub(rf'"{observed_at}":"[^"]*"', f'"{observed_at}":"%s"', text)
    return text


def start(
    base_url: str,
    path: str,
    method: str,
    requests: Path,
    *,
    interval_s: float,
    duration_s: float,
    connections: int,
    workdir: Path,
    threads: int = 1,
) -> subprocess.Popen[str]:
    script = workdir / "paced.lua"
    # Written once: every wrk thread loads the script file again when it starts, and one
    # that read it while a later start() was rewriting it ran with no script at all (a
    # flood of GET /).
    if not script.exists():
        script.write_text(LUA)
    argv = [
        "wrk", f"-t{threads}", f"-c{connections}", f"-d{duration_s:g}s", "--timeout", "30s",
        "-s", str(script), base_url, "--",
        str(requests), path, method, f"{interval_s:g}", str(threads), str(connections),
        str(int(time.time())),
    ]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def result(proc: subprocess.Popen[str], timeout_s: float) -> PacedResult:
    out, _ = proc.communicate(timeout=timeout_s)
    found = re.search(r"^MFRESULT (.*)$", out, re.MULTILINE)
    if proc.returncode != 0 or found is None:
        raise RuntimeError(f"wrk failed ({proc.returncode}):\n{out[-2000:]}")
    data = json.loads(found.group(1))
    kinds = {k: int(data[k]) for k in ("status", "connect", "read", "write", "timeout")}
    p50_s, p99_s = data["p50_us"] / 1e6, data["p99_us"] / 1e6
    return PacedResult(data["requests"], p50_s, p99_s, sum(kinds.values()), kinds)
