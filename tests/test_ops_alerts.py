"""The alert rules (ops/alerts/) and the Grafana dashboard (ops/grafana/) name only
metrics the code exports, and the rules do what their unit tests say.

"Exported" is read from the code itself: the registries the API and the workers build
(api/metrics.py, api/loop_health.py, workers/metrics.py, broker/jetstream/metrics.py,
workers/fleet_metrics.py), so a renamed metric fails here rather than in a silent panel.
`promtool` (Debian's prometheus package, installed by .ci/run) checks the rules, runs
ops/alerts/tests.yml, and parses every dashboard expression as PromQL.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from api.loop_health import LoopHealth
from api.metrics import ApiMetrics
from broker.jetstream.metrics import JetStreamMetrics
from workers.fleet_metrics import FleetGauges
from workers.metrics import PipelineMetrics

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parent.parent
ALERTS = REPO / "ops" / "alerts"
RULES = ALERTS / "modelforge.rules.yml"
DASHBOARD = REPO / "ops" / "grafana" / "modelforge.json"
METRIC = re.compile(r"\bmodelforge_[a-zA-Z0-9_]+")
# Issue 18, item 5: the conditions an operator must hear about.
REQUIRED_ALERTS = {
    "ModelForgeNodesStale",
    "ModelForgeNodesOffline",
    "ModelForgePartitionHold",
    "ModelForgeRelayBacklog",
    "ModelForgeDeadLetters",
    "ModelForgeLeaseExpiries",
    "ModelForgeDownloadStalled",
    "ModelForgeDeploymentUnavailable",
}
SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum"),
}


def exported_metrics() -> set[str]:
    """Every series name the API and worker processes can serve."""
    api = ApiMetrics()
    LoopHealth(api.registry)
    worker = CollectorRegistry()
    PipelineMetrics(worker)
    JetStreamMetrics(worker)
    FleetGauges(worker)
    names: set[str] = set()
    for registry in (api.registry, worker):
        for family in registry.collect():
            names |= {family.name + suffix for suffix in SUFFIXES[family.type]}
    return names


def rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def dashboard_exprs() -> list[tuple[str, str]]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(panel["title"], target["expr"]) for panel in panels for target in panel["targets"]]


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        message = "promtool is missing (Debian: apt-get install prometheus; .ci/run does)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args],
        cwd=ALERTS,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_exported_names_are_read_from_the_code() -> None:
    names = exported_metrics()
    # A few of each kind, so an empty or wrongly suffixed set cannot pass the rest.
    assert "modelforge_http_request_duration_seconds_bucket" in names
    assert "modelforge_messages_dead_lettered_total" in names
    assert "modelforge_fleet_nodes" in names
    assert "modelforge_event_loop_lag_seconds_bucket" in names


def test_every_rule_names_only_exported_metrics() -> None:
    exported = exported_metrics()
    for rule in rules():
        unknown = set(METRIC.findall(rule["expr"])) - exported
        assert not unknown, f"{rule['alert']}: not exported by any process: {sorted(unknown)}"


def test_the_issue_s_alerts_are_there_each_with_a_runbook() -> None:
    found = {rule["alert"]: rule for rule in rules()}
    assert found.keys() >= REQUIRED_ALERTS
    for name, rule in found.items():
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        assert (REPO / rule["annotations"]["runbook"]).is_file(), name


def test_every_dashboard_panel_names_only_exported_metrics() -> None:
    exported = exported_metrics()
    exprs = dashboard_exprs()
    assert exprs
    for title, expr in exprs:
        named = set(METRIC.findall(expr))
        assert named, f"{title}: names no ModelForge metric"
        assert named <= exported, f"{title}: not exported: {sorted(named - exported)}"


def test_promtool_checks_the_rules() -> None:
    result = run_promtool("check", "rules", RULES.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_promtool_runs_the_rules_unit_tests() -> None:
    result = run_promtool("test", "rules", "tests.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_parses_every_dashboard_expression(tmp_path: Path) -> None:
    # promtool parses PromQL only inside rule files: one recording rule per expression.
    recorded = [
        {"record": f"dashboard:panel_{i}", "expr": expr}
        for i, (_, expr) in enumerate(dashboard_exprs())
    ]
    file = tmp_path / "dashboard.rules.yml"
    file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": recorded}]}))
    result = run_promtool("check", "rules", str(file))
    assert result.returncode == 0, result.stdout + result.stderr
