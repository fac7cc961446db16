"""The dashboard's Usage view (issue 33) in headless Chromium (tests/ui_helpers.py): a
client's requests, errors by code and tokens per client and model in the table and its
line in the charts, the client filter narrowing the API's report, and a client's name
that is markup shown as text. Real API, gateway and PostgreSQL.

Two ways in: the client with the markup name calls the gateway itself (no deployment
serves its model, so each call is refused and metered with the code it got, flushed by
api/gateway/usage.py); the other's answered invokes, with tokens and times to first
token, are written with store/rollup/usage.py: add, the very call that flush makes (an
answered invoke needs a node playing the runtime: tests/test_gateway_usage.py).
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from schemas.usage import TTFT_BUCKETS_S, USAGE, ttft_bucket
from store.rollup.usage import UsageDelta
from tests.api_server import ApiFactory, RunningApi
from tests.deployment_flows import created_service_client
from tests.rollup_flows import write_usage
from tests.ui_helpers import ARRIVAL_MS, signed_in
from tests.usage_flows import call, gateway

# Markup an operator could name a client: executed, it would set the flag; interpreted,
# it would leave an <img> in the view.
HOSTILE = '<img src=x onerror="window.__pwned=1">'
MODEL = "smol"
FLUSHED_S = 20.0


def _delta(
    client_id: str, minute: datetime, outcome: str, requests: int, ttft_s: float
) -> UsageDelta:
    buckets = [0] * len(TTFT_BUCKETS_S)
    ok = outcome == "ok"
    buckets[ttft_bucket(ttft_s)] = requests if ok else 0
    return UsageDelta(
        minute=minute,
        client_id=uuid.UUID(client_id),
        model=MODEL,
        outcome=outcome,
        requests=requests,
        prompt_tokens=100 * requests if ok else 0,
        completion_tokens=50 * requests if ok else 0,
        ttft_count=requests if ok else 0,
        ttft_sum_s=ttft_s * requests if ok else 0.0,
        ttft_buckets=tuple(buckets),
    )


def _metered(api: RunningApi, client_id: str, requests: int) -> None:
    """Wait until the gateway's flush shows the client's requests in the usage report."""
    deadline = time.monotonic() + FLUSHED_S
    with api.client() as client:
        while True:
            report = client.get(
                USAGE, params={"client": client_id, "step": "minute"}, headers=api.admin_headers
            )
            if report.status_code == 200 and report.json()["totals"]["requests"] >= requests:
                return
            assert time.monotonic() < deadline, f"usage not flushed in {FLUSHED_S} s: {report.text}"
            time.sleep(0.1)


def test_usage_per_client_and_model(
    api_factory: ApiFactory, browser_page: Any, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    page = browser_page
    dialogs: list[str] = []

    def dismissed(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", dismissed)
    api = gateway(api_factory)
    with api.client() as client:
        alpha = created_service_client(client, api, name="alpha", models=[MODEL])["id"]
        hostile = created_service_client(client, api, name=HOSTILE, models=[MODEL])
    # Through the gateway: no deployment serves the model, each call refused and metered.
    refusals = [call(api, hostile["secret"]) for _ in range(2)]
    assert [r.status_code for r in refusals] == [404, 404]
    code = refusals[0].json()["error"]["code"]
    _metered(api, hostile["id"], 2)
    minute = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=1)
    earlier = minute - timedelta(minutes=5)
    write_usage(api.settings.database_url, [
        _delta(alpha, earlier, "ok", 4, 0.2),
        _delta(alpha, minute, "ok", 3, 0.2),
        _delta(alpha, minute, "rate_limited", 2, 0.0),
    ])  # fmt: skip

    signed_in(page, api)
    page.click('#tabs a[data-view="usage"]')
    page.evaluate("window.__notReloaded = true")
    row = page.locator(f'#usage tbody tr[data-client-id="{alpha}"]')
    expect(row.locator('[data-role="requests"]')).to_have_text("9", timeout=ARRIVAL_MS)
    expect(row.locator('[data-role="errors"]')).to_have_text("rate_limited 2")
    expect(row.locator('[data-role="prompt"]')).to_have_text("700")
    expect(row.locator('[data-role="completion"]')).to_have_text("350")
    # Its pair's percentiles over the range (every sample in the 0.1-0.25 s bucket).
    expect(row.locator('[data-role="p50"]')).to_have_text("175 ms", timeout=ARRIVAL_MS)
    other = page.locator(f'#usage tbody tr[data-client-id="{hostile["id"]}"]')
    expect(other.locator('[data-role="client"]')).to_have_text(HOSTILE)
    expect(other.locator('[data-role="requests"]')).to_have_text("2")
    expect(other.locator('[data-role="errors"]')).to_have_text(f"{code} 2")
    expect(page.locator('#usage tfoot [data-role="totals"]')).to_contain_text("11")
    # A line per client over the hour's minutes, named in the legend as text.
    chart = page.locator('figure[data-chart="requests"]')
    expect(chart.locator("svg polyline")).to_have_count(2)
    expect(chart.locator(".legend")).to_contain_text(HOSTILE)
    assert int(chart.locator("svg").get_attribute("data-samples") or 0) >= 60

    # More usage is read on Refresh; the client filter is the API's.
    write_usage(api.settings.database_url, [_delta(alpha, minute, "ok", 10, 0.2)])
    page.click('#usage-filter button[type="submit"]')
    expect(row.locator('[data-role="requests"]')).to_have_text("19", timeout=ARRIVAL_MS)
    with page.expect_request(lambda r: f"client={alpha}" in r.url and "limit=10000" in r.url):
        page.select_option('#usage-filter select[name="client"]', alpha)
    expect(page.locator("#usage tbody tr")).to_have_count(1, timeout=ARRIVAL_MS)
    expect(row).to_be_visible()

    page.screenshot(path=tmp_path / "usage.png", full_page=True)
    assert page.locator("#view-usage img").count() == 0
    assert page.evaluate("window.__pwned") is None
    assert dialogs == []
    assert page.evaluate("window.__notReloaded") is True
