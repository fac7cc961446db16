"""Where a gateway request's time to first token goes, request by request: the trace
that ops/bench/hop_trace.patch writes, read back.

    git apply ops/bench/hop_trace.patch
    MF_TRACE=/tmp/trace.log python ops/bench/gateway.py --workload tools \\
        --requests 80 --concurrency 1,4 --token-gap-s 300
    git apply -R ops/bench/hop_trace.patch
    python ops/bench/hop_trace.py /tmp/trace.log --per-level 160

The patch (never committed into the code it touches) appends one line per event,
`time.perf_counter()` (CLOCK_MONOTONIC: one clock for every process on the box), from
the bench's client, the API and the runtime worker. Each gateway request is followed by
its correlation id (the bench sends one) to its invoke id (the API's `deliver` line):

    client send -> the route's first dependency (`inb`) -> delivered on the runtime
    channel (`route`) -> read by the worker (`chan`) -> posted to llama-server (`prep`)
    -> llama-server's first tool-call chunk at the worker (`llama`) -> that chunk at
    the API (`up`) -> the first tool-call delta at the client (`out`)

`added` is the whole time less `llama`: what the path costs this one request, with
llama-server's own time (its batching, its queue) taken out. That is the gateway's
added time to first token measured per request, where the bench's table compares two
distributions whose tails are llama-server's own (at 4 clients in a closed loop the
direct side's TTFT p99 moved 445-554 ms between runs). The worker and the API mark the
first chunk that holds `tool_calls` or content text, as the bench's client does, so
any streamed workload (chat, tools, json_schema) reads the same way.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from gateway_rounds import pct  # a sibling: this runs as ops/bench/hop_trace.py

HOPS = ("inb", "route", "chan", "prep", "llama", "up", "out")
# The bench's warm-up: 4 requests each way (d0-d3, then g4-g7) before the rounds.
WARM_UP = 8


@dataclass
class Request:
    sent: float
    cid: str
    ms: dict[str, float]


def read(path: Path) -> tuple[list[Request], list[tuple[float, float]]]:
    """The gateway's requests with their hops, and the direct side's (send, TTFT ms)."""
    events: dict[str, dict[str, float]] = defaultdict(dict)
    invoke_of: dict[str, str] = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        at, tag, key = float(parts[0]), parts[2], parts[3]
        if tag == "deliver":  # deliver <correlation id> <invoke id> <arrived>
            invoke_of[key] = parts[4]
            events[parts[4]].update(deliver=at, arrived=float(parts[5]))
        else:
            events[key].setdefault(tag, at)
    gateway = []
    for cid, iid in invoke_of.items():
        c, w = events[cid], events[iid]
        if "c_first" not in c or int(cid[1:]) < WARM_UP:
            continue
        # No tool_frame line: the first frame already held the first token.
        at_api = w.get("tool_frame", w.get("first_frame", 0.0))
        marks = (c["c_send"], w["arrived"], w["deliver"], w["w_got"], w["w_post"],
                 w["w_tool"], at_api, c["c_first"])  # fmt: skip
        ms = {hop: (marks[i + 1] - marks[i]) * 1000 for i, hop in enumerate(HOPS)}
        ms["total"] = (c["c_first"] - c["c_send"]) * 1000
        ms["added"] = ms["total"] - ms["llama"]
        gateway.append(Request(c["c_send"], cid, ms))
    direct = [
        (e["c_send"], (e["c_first"] - e["c_send"]) * 1000)
        for cid, e in events.items()
        if cid.startswith("d") and "c_first" in e and int(cid[1:]) >= WARM_UP
    ]
    return sorted(gateway, key=lambda r: r.sent), sorted(direct)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument(
        "--per-level", type=int, required=True,
        help="gateway requests per closed-loop level: twice the bench's --requests",
    )  # fmt: skip
    args = parser.parse_args()
    gateway, direct = read(args.trace)
    n = args.per_level
    for level in range(0, len(gateway), n):
        rows = gateway[level : level + n]
        ttfts = [ms for _, ms in direct[level : level + n]]
        print(f"level {level // n + 1}: {len(rows)} gateway requests; the direct side's TTFT "
              f"p50 {pct(ttfts, 50):.1f} p99 {pct(ttfts, 99):.1f} ms")  # fmt: skip
        for hop in ("total", "added", *HOPS):
            values = [r.ms[hop] for r in rows]
            print(f"  {hop:>6} p50 {pct(values, 50):7.2f}  p90 {pct(values, 90):7.2f}  "
                  f"p99 {pct(values, 99):7.2f}  max {max(values):7.2f} ms")  # fmt: skip
        slowest = max(rows, key=lambda r: r.ms["added"])
        hops = ", ".join(f"{hop} {slowest.ms[hop]:.1f}" for hop in HOPS)
        print(f"  the most added: {slowest.cid} {slowest.ms['added']:.1f} ms ({hops})")


if __name__ == "__main__":
    main()
