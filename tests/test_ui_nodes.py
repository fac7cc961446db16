"""The Nodes tab in headless Chromium: relative times that tick in place (the absolute
time on hover), and the node panel, every part of it from the real API (labels, agent,
last heartbeat, artifact roots and artifacts, the runtime worker's devices and queue,
the deployments on the node, the sparklines), hostile text shown as text, and its close
control. The favicon is served as SVG and linked from both pages. Real API, relay, NATS
and PostgreSQL; the browser comes from tests/ui_helpers.py."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable
from typing import Any

from sqlalchemy import NullPool, text
from sqlalchemy.ext.asyncio import create_async_engine

from schemas.ui import UI_ASSETS, UI_LOGIN, UI_PREFIX
from tests.admin_helpers import beat, ok, patch_node
from tests.api_server import RunningApi
from tests.deployment_flows import create_deployment, deployment_body
from tests.flows import TELEMETRY, telemetry_body
from tests.runtime_flows import create_profile, environment_id, ready_node, report_runtime
from tests.services import run_async
from tests.ui_helpers import ARRIVAL_MS, signed_in

HOSTILE = '<img src=x onerror="window.__pwned=1">&amp;'


def rollup_minutes(database_url: str, node_id: uuid.UUID, minutes_ago: Iterable[int]) -> None:
    """node_minutes rows as the rollup worker writes them (store/rollup/nodes.py), for
    minutes in the past that the test cannot wait for."""

    async def write() -> None:
        engine = create_async_engine(database_url, poolclass=NullPool)
        try:
            async with engine.begin() as connection:
                for ago in minutes_ago:
                    await connection.execute(
                        text(
                            "INSERT INTO node_minutes (node_id, minute, ram_total_bytes,"
                            " ram_used_bytes, gpu_utilization_percent) VALUES (:node,"
                            " date_trunc('minute', now()) - make_interval(mins => :ago),"
                            " 100, :ago, 40)"
                        ),
                        {"node": node_id, "ago": ago},
                    )
        finally:
            await engine.dispose()

    run_async(write)


def test_the_favicon_is_served_and_linked(api: RunningApi) -> None:
    with api.client() as client:
        icon = client.get(f"{UI_ASSETS}/favicon.svg")
        assert icon.status_code == 200
        assert icon.headers["content-type"] == "image/svg+xml"
        assert icon.content.startswith(b"<svg")
        login = client.get(UI_LOGIN)
        assert f'<link rel="icon" href="{UI_ASSETS}/favicon.svg"' in login.text


def test_node_panel_and_ticking_times(
    api: RunningApi, database_url: str, browser_page: Any
) -> None:
    from playwright.sync_api import expect

    page = browser_page
    with api.client() as client:
        node = ready_node(client, api, hostname="panel-host")
        ok(patch_node(client, api, node.node_id, display_name=HOSTILE, labels={"rack": "r7"}))
        ok(beat(client, node))
        device = {"device_id": "cpu", "backend": "cpu", "name": HOSTILE, "queue_depth": 3}
        assert report_runtime(client, node, 2, devices=[device]).status_code == 200
        ok(client.put(TELEMETRY, json=telemetry_body(node.node_id, 1), headers=node.headers))
        profile = create_profile(client, api)
        body = deployment_body(node, profile["id"], environment_id(client, api))
        made = create_deployment(client, api, body)
    # The rollup's minutes before the panel opens: the lines start from them.
    rollup_minutes(database_url, uuid.UUID(node.node_id), range(30, 25, -1))

    signed_in(page, api)
    page.click('#tabs a[data-view="nodes"]')
    row = page.locator(f'tr[data-node-id="{node.node_id}"]')
    expect(row).to_contain_text(HOSTILE)  # the markup as text, not an element

    # "Last heartbeat" ticks in place: the same row element, its text rewritten, the
    # absolute time on hover.
    heartbeat = row.locator('[data-role="heartbeat"] time')
    expect(heartbeat).to_have_text(re.compile(r"^\d+ s ago$"), timeout=ARRIVAL_MS)
    assert heartbeat.get_attribute("title")
    page.evaluate(
        "id => { window.__row = document.querySelector(`tr[data-node-id='${id}']`); }",
        node.node_id,
    )
    first = heartbeat.inner_text()
    page.wait_for_function(
        "([id, was]) => document.querySelector(`tr[data-node-id='${id}'] time`).textContent"
        " !== was",
        arg=[node.node_id, first],
        timeout=ARRIVAL_MS,
    )
    assert page.evaluate(
        "id => window.__row === document.querySelector(`tr[data-node-id='${id}']`)",
        node.node_id,
    )

    # The panel: every part, from the API.
    row.click()
    panel = page.locator("#node-detail")
    expect(panel).to_be_visible()
    expect(panel.locator('[data-role="title"]')).to_contain_text(HOSTILE)
    expect(panel.locator('[data-role="labels"]')).to_have_text("rack=r7")
    expect(panel.locator('[data-role="agent"]')).to_contain_text("1.0.0")
    expect(panel.locator('[data-role="heartbeat"] time')).to_contain_text("ago")
    expect(panel.locator('[data-role="roots"] li')).to_have_count(1)
    expect(panel.locator("#node-artifacts tbody tr")).to_have_count(1)
    devices = panel.locator("#node-devices tbody tr")
    expect(devices).to_have_count(1)
    expect(devices).to_contain_text(HOSTILE)
    expect(devices.locator('[data-role="queue"]')).to_have_text("3")
    deployments = panel.locator(f'#node-deployments tr[data-deployment-id="{made["id"]}"]')
    expect(deployments).to_contain_text("smol")
    # What it serves (the default two) and, before any load, tool calls unknown.
    expect(deployments.locator('[data-role="endpoints"]')).to_have_text("chat, completions")
    expect(deployments.locator('[data-role="tool-calls"]')).to_have_text("unknown")
    # Five minutes from the rollup, and the current one (the history's, then the samples);
    # the GPU line has the rollup's only (the node reports no GPU now).
    ram = panel.locator('svg.spark[data-series="ram"]')
    expect(ram).to_have_attribute("data-samples", "6")
    gpu = panel.locator('svg.spark[data-series="gpu"]')
    expect(gpu).to_have_attribute("data-samples", "5")
    # Extended live while open: a new sample (RAM 25% -> 50%) moves the current minute.
    ram_now = panel.locator('[data-role="spark-ram"]')
    expect(ram_now).to_have_text(re.compile(r" 25%$"))
    sample = telemetry_body(node.node_id, 2) | {"ram_used_bytes": 2**37}
    with api.client() as client:
        ok(client.put(TELEMETRY, json=sample, headers=node.headers))
    expect(ram_now).not_to_have_text(re.compile(r" 25%$"), timeout=ARRIVAL_MS)
    # Nothing the API said became markup.
    assert panel.locator("img").count() == 0
    assert page.evaluate("window.__pwned") is None

    # Closed by its control (and by Escape).
    panel.locator('[data-role="close"]').click()
    expect(panel).to_be_hidden()
    row.click()
    expect(panel).to_be_visible()
    page.keyboard.press("Escape")
    expect(panel).to_be_hidden()
    assert page.url.startswith(f"{api.base_url}{UI_PREFIX}")
