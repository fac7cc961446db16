"""The Audit tab in headless Chromium: one server-side page at a time (Older / Newer),
the API's filters (kind, node, actor, time), the periodic health checks hidden until
asked for (on the page and in what the stream adds), and the correlation id whole. Real
API, relay, NATS and PostgreSQL; the browser comes from tests/ui_helpers.py."""

from __future__ import annotations

import re
from typing import Any

from tests.admin_helpers import audit, ok
from tests.api_server import RunningApi
from tests.artifact_flows import COMMIT, REPOSITORY
from tests.flows import NODES, TOKENS, enroll
from tests.runtime_flows import create_probe, ready_node
from tests.ui_helpers import ARRIVAL_MS, signed_in

PAGE = 50
DASH = "\u2013"  # the pager's en dash, between the first and last row
TOKENS_MADE = 52


def test_audit_view_pages_filters_and_hides_health_checks(
    api: RunningApi, browser_page: Any
) -> None:
    from playwright.sync_api import expect

    page = browser_page
    health = {"device_id": "cpu", "kind": "runtime.health.v1"}
    with api.client() as client:
        node = ready_node(client, api, hostname="audited-host")
        other = enroll(client, api, hostname="other-host")
        health_job = ok(create_probe(client, api, {**health, "node_id": node.node_id}), 201)["id"]
        for i in range(TOKENS_MADE):
            ok(client.post(TOKENS, json={"note": f"t{i}"}, headers=api.admin_headers), 201)
        total = len(audit(client, api))  # settled: every row written
    assert total > PAGE + 1

    signed_in(page, api)
    page.click('#tabs a[data-view="audit"]')
    rows = page.locator("#audit tbody tr")
    expect(rows).to_have_count(PAGE)
    pager = page.locator('#audit-filter [data-role="range"]')
    expect(pager).to_have_text(f"1{DASH}{PAGE}")
    # The correlation id whole, not cut to 8 characters.
    correlation = rows.first.locator('[data-role="correlation"]')
    assert len(correlation.inner_text()) > 8
    # Older, then Newer again.
    page.click('#audit-filter [data-page="next"]')
    expect(pager).to_have_text(f"{PAGE + 1}{DASH}{total}")
    page.click('#audit-filter [data-page="prev"]')
    expect(pager).to_have_text(f"1{DASH}{PAGE}")

    # The node's rows: its own and its jobs', the health check's left out by default.
    page.fill('#audit-filter [name="node_id"]', node.node_id)
    page.click('#audit-filter button[type="submit"]')
    expect(rows.filter(has_text="node.enrolled")).to_have_count(1)
    expect(rows.filter(has_text="job.")).not_to_have_count(0)
    expect(page.locator(f'#audit td[title="{health_job}"]')).to_have_count(0)
    page.check('#audit-filter [name="health_checks"]')
    expect(page.locator(f'#audit td[title="{health_job}"]')).to_have_count(1)
    assert other.node_id not in page.locator("#audit").inner_text()
    page.uncheck('#audit-filter [name="health_checks"]')
    expect(page.locator(f'#audit td[title="{health_job}"]')).to_have_count(0)

    # By kind and actor; a time window in the future holds nothing.
    page.fill('#audit-filter [name="node_id"]', "")
    page.select_option('#audit-filter [name="kind"]', "node")
    page.fill('#audit-filter [name="actor"]', f"node:{other.node_id}")
    page.click('#audit-filter button[type="submit"]')
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("node.enrolled")
    page.select_option('#audit-filter [name="kind"]', "")
    page.fill('#audit-filter [name="actor"]', "")
    page.fill('#audit-filter [name="since"]', "2099-01-01T00:00:00")
    page.click('#audit-filter button[type="submit"]')
    expect(rows).to_have_text(["No audit rows match."])
    page.fill('#audit-filter [name="since"]', "")
    page.click('#audit-filter button[type="submit"]')
    expect(rows).to_have_count(PAGE)

    # Live: a new health check stays off the page, a new eviction job comes on top.
    with api.client() as client:
        ok(create_probe(client, api, {**health, "node_id": node.node_id}), 201)
        evict = {"repository": REPOSITORY, "commit": COMMIT}
        path = f"{NODES}/{node.node_id}/artifacts/evict"
        job = ok(client.post(path, json=evict, headers=api.admin_headers), 201)["id"]
    expect(rows.first).to_have_attribute("data-audit-action", "job.created", timeout=ARRIVAL_MS)
    expect(rows.first.locator("td").nth(3)).to_have_attribute("title", job)
    expect(rows).to_have_count(PAGE)
    assert re.fullmatch(r"\d+ s ago", rows.first.locator("time").inner_text())
