"""`modelforge admin overview`: the fleet at a glance, the figures the dashboard's
Overview opens with (GET /api/v1/admin/overview): nodes, GPUs, deployments and services
now, and the gateway's last complete minute. Each line fits 80 columns; -o json gives
the answer whole."""

from __future__ import annotations

from collections.abc import Mapping

import typer

from cli.admin.answers import answer
from cli.admin.cells import iso, millis, size
from cli.admin.context import FormatOption, JsonOption, output
from schemas.overview import OVERVIEW, GatewayFigures, GpuFigures, OverviewNow


def overview(ctx: typer.Context, json: JsonOption = False, fmt: FormatOption = None) -> None:
    """Nodes, GPUs, deployments and services now; the gateway's last complete minute."""
    now = answer(ctx, lambda c: c.get(OverviewNow, OVERVIEW))
    output(json, fmt).detail(now, fields(now))


def fields(now: OverviewNow) -> list[tuple[str, object]]:
    gateway = now.gateway
    return [
        ("at", now.at),
        ("nodes", counted(now.nodes)),
        ("GPUs", gpus(now.gpus)),
        ("deployments", counted(now.deployments)),
        ("services", counted(now.services)),
        ("gateway", f"the minute from {iso(gateway.window_start)}"),
        ("requests", rates(gateway)),
        ("errors", errors(gateway)),
        ("tokens", tokens(gateway)),
        ("TTFT", ttft(gateway)),
    ]


def counted(by_state: Mapping[str, int]) -> str:
    """ "3 online, 1 stale": the states that have any, in the answer's order."""
    present = [f"{count} {state}" for state, count in by_state.items() if count]
    return ", ".join(present) or "none"


def gpus(figures: GpuFigures) -> str:
    if figures.count == 0:
        return "none"
    used = f"{size(figures.memory_used_bytes)} of {size(figures.memory_total_bytes)} used"
    busy = figures.utilization_percent
    load = f", {busy:.0f}% busy" if busy is not None else ""
    return f"{figures.count}, {used}{load}"


def rates(gateway: GatewayFigures) -> str:
    return f"{gateway.requests_per_s:.2f}/s"


def errors(gateway: GatewayFigures) -> str:
    if not gateway.errors:
        return f"{gateway.errors_per_s:.2f}/s"
    worst = sorted(gateway.errors.items(), key=lambda item: (-item[1], item[0]))
    codes = ", ".join(f"{code} {rate:.2f}/s" for code, rate in worst)
    return f"{gateway.errors_per_s:.2f}/s ({codes})"


def tokens(gateway: GatewayFigures) -> str:
    return (
        f"{gateway.tokens_per_s:.1f}/s ({gateway.prompt_tokens_per_s:.1f} in,"
        f" {gateway.completion_tokens_per_s:.1f} out)"
    )


def ttft(gateway: GatewayFigures) -> str:
    if gateway.ttft_p50_s is None or gateway.ttft_p99_s is None:
        return "-"
    return f"p50 {millis(gateway.ttft_p50_s)}, p99 {millis(gateway.ttft_p99_s)}"
