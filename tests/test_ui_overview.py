"""The dashboard's Overview (issue 33), its landing page, in headless Chromium (tests/
ui_helpers.py): the counts of a small fleet (nodes in two liveness states, a node's
GPUs), a node coming online shown without a reload, a minute the rollup recorded drawn
in the charts with its figures on hover, and the range picker asking the API for that
range's history. Real API, relay, NATS and PostgreSQL.

The history's minute is written as the rollup worker writes it (one fleet_minutes row),
two minutes back: the worker records the minute it runs in, which the history shows
only once that minute is complete.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from schemas.overview import OVERVIEW_HISTORY
from store.engine import make_engine, make_sessionmaker
from store.rollup.tables import FleetMinute
from tests.admin_helpers import beat, ok
from tests.api_server import RunningApi
from tests.flows import INVENTORY, enroll, gpu, inventory_body
from tests.services import run_async
from tests.ui_helpers import ARRIVAL_MS, signed_in

GIB = 2**30


def _recorded_minute(api: RunningApi, minute: datetime, online: int, offline: int) -> None:
    """One minute of the fleet as the rollup worker records it (store/rollup/fleet.py)."""
    row = FleetMinute(
        minute=minute,
        nodes={"online": online, "stale": 0, "offline": offline, "disabled": 0},
        gpus=2,
        gpu_memory_total_bytes=282 * GIB,
        gpu_memory_used_bytes=100 * GIB,
        gpu_utilization_percent=50.0,
        deployments={},
        services={},
    )

    async def write() -> None:
        engine = make_engine(api.settings.database_url, pool_size=1)
        try:
            async with make_sessionmaker(engine)() as session, session.begin():
                session.add(row)
        finally:
            await engine.dispose()

    run_async(write)


def test_overview_counts_update_live_and_pick_a_range(
    api: RunningApi, browser_page: Any, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    page = browser_page
    refused: list[str] = []
    page.on("console", lambda m: refused.append(m.text) if "Refused" in m.text else None)
    client = api.client()
    # Three nodes, offline until they beat; the first with two GPUs. Two beat.
    nodes = [enroll(client, api, hostname=f"gpu-ov-{i}") for i in range(3)]
    inventory = inventory_body(nodes[0].node_id, 1, gpus=[gpu(0), gpu(1)], hostname="gpu-ov-0")
    ok(client.put(INVENTORY, json=inventory, headers=nodes[0].headers))
    for node in nodes[:2]:
        ok(beat(client, node))
    minute = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=2)
    _recorded_minute(api, minute, online=2, offline=1)

    # The landing page is the Overview.
    signed_in(page, api)
    expect(page.locator("#view-overview")).to_be_visible()
    page.evaluate("window.__notReloaded = true")
    tile = page.locator('[data-tile="nodes"]')
    expect(tile.locator('[data-role="value"]')).to_have_text("3", timeout=ARRIVAL_MS)
    expect(tile.locator('[data-count="online"]')).to_have_text("online 2")
    expect(tile.locator('[data-count="offline"]')).to_have_text("offline 1")
    gpus = page.locator('[data-tile="gpus"]')
    expect(gpus.locator('[data-role="value"]')).to_have_text("2")
    expect(gpus.locator('[data-role="breakdown"]')).to_contain_text("282 GiB free")

    # The recorded minute in the chart (a point among the hour's empty minutes), its
    # figures on hover.
    chart = tile.locator("svg.chart")
    expect(chart).to_have_attribute("data-samples", "60", timeout=ARRIVAL_MS)
    dot = chart.locator(".lines circle").first
    box = dot.bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    expect(chart.locator("g.hover")).to_have_attribute("visibility", "visible")
    expect(chart.locator("g.hover text")).to_contain_text("online: 2")
    expect(chart.locator("g.hover text")).to_contain_text("offline: 1")

    # The third node beats: the counts follow, without a reload, written in place.
    online = tile.locator('[data-count="online"]')
    online.evaluate("count => { count.__same = true; }")
    ok(beat(client, nodes[2]))
    expect(online).to_have_text("online 3", timeout=ARRIVAL_MS)
    expect(tile.locator('[data-count="offline"]')).to_have_text("offline 0")
    assert online.evaluate("count => count.__same === true") is True

    # The range picker asks for that range's history.
    with page.expect_request(lambda r: OVERVIEW_HISTORY in r.url and "range=6h" in r.url):
        page.click('.ranges button[data-range="6h"]')
    expect(page.locator('.ranges button[data-range="6h"]')).to_have_attribute(
        "aria-pressed", "true"
    )
    expect(chart).to_have_attribute("data-samples", "360", timeout=ARRIVAL_MS)

    page.screenshot(path=tmp_path / "overview.png", full_page=True)
    assert page.evaluate("window.__notReloaded") is True
    assert refused == [], refused
    client.close()
