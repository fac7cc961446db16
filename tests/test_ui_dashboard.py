"""The fleet dashboard (/ui) in headless Chromium (Debian's `chromium`, driven by
Playwright): login, the node list, a liveness change and a job's progress arriving over
the event stream without a reload, and logout; the page's event stream ending with its
session, and a refusal's code and message in the error bar. Real API, relay, NATS and
PostgreSQL.

Each view's screenshot is written to docs/ui/ (the README shows them): the test is what
keeps them current.

The browser and the signed-in page come from tests/ui_helpers.py (a plugin): without
chromium or Playwright the test skips on a developer's machine and fails under CI=true,
where .ci/run installs both.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx

from schemas.ui import CSRF_COOKIE, CSRF_HEADER, SESSION_COOKIE, UI_LOGIN, UI_LOGOUT, UI_PREFIX
from tests.admin_helpers import beat, get_node, ok, patch_node
from tests.api_server import OPERATOR_KEY, ApiFactory, RunningApi
from tests.artifact_flows import (
    COMMIT,
    REPOSITORY,
    ROOT,
    claimed,
    complete,
    created,
    fence,
    progress,
)
from tests.flows import (
    INVENTORY,
    NODES,
    TELEMETRY,
    TOKENS,
    enroll,
    gpu,
    inventory_body,
    telemetry_body,
)
from tests.ui_helpers import ARRIVAL_MS, signed_in

SCREENSHOTS = Path(__file__).resolve().parent.parent / "docs" / "ui"
HOSTNAME = "gpu-dash-01"
# The stream's keep-alive in the logout test: it must close within one.
KEEPALIVE_S = 1.0


def _node_with_gpus(client: httpx.Client, api: RunningApi) -> tuple[Any, list[str]]:
    """An enrolled node whose inventory offers two GPUs and an artifact root."""
    node = enroll(client, api, hostname=HOSTNAME, labels={"rack": "a1"})
    gpus = [gpu(0), gpu(1)]
    body = inventory_body(node.node_id, 1, gpus=gpus, hostname=HOSTNAME)
    body["host"]["artifact_roots"] = [ROOT]
    ok(client.put(INVENTORY, json=body, headers=node.headers))
    return node, [g["uuid"] for g in gpus]


def test_dashboard(api: RunningApi, browser_page: Any) -> None:
    from playwright.sync_api import expect

    page = browser_page
    base = api.base_url
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    # Offline: any request to another origin is refused and recorded.
    elsewhere: list[str] = []

    def only_here(route: Any) -> None:
        if route.request.url.startswith(base):
            route.continue_()
        else:
            elsewhere.append(route.request.url)
            route.abort()

    page.route("**/*", only_here)
    # What the Content-Security-Policy refused (an inline style, a foreign script) is a
    # console error; a refused login's 401 is one too, and is expected.
    refused: list[str] = []
    page.on("console", lambda m: refused.append(m.text) if "Refused" in m.text else None)

    client = api.client()
    node, gpu_uuids = _node_with_gpus(client, api)
    assert get_node(client, api, node.node_id)["liveness"] == "offline"

    # Login: /ui sends a stranger to the login page; a wrong key is refused there.
    first = page.goto(f"{base}{UI_PREFIX}")
    assert first is not None
    assert page.url == f"{base}{UI_LOGIN}"
    assert "default-src 'self'" in first.headers["content-security-policy"]
    page.fill("#operator_key", "not-the-key")
    page.click("#login")
    expect(page.get_by_role("alert")).to_have_text("Invalid operator key.")
    assert page.url == f"{base}{UI_LOGIN}"
    page.screenshot(path=SCREENSHOTS / "login.png")
    page.fill("#operator_key", OPERATOR_KEY)
    page.click("#login")
    page.wait_for_url(f"{base}{UI_PREFIX}")

    # The key is in neither the URL nor the page's storage; the cookie is HttpOnly, Strict.
    assert OPERATOR_KEY not in page.url
    stored = page.evaluate("JSON.stringify([{...localStorage}, {...sessionStorage}])")
    assert stored == "[{},{}]"
    assert OPERATOR_KEY not in page.evaluate("document.cookie")
    session = next(c for c in page.context.cookies() if c["name"] == SESSION_COOKIE)
    assert session["httpOnly"] and session["sameSite"] == "Strict"
    assert OPERATOR_KEY not in session["value"]

    # The landing page is the Overview; the node list shows the node; the stream is open.
    expect(page.locator("#view-overview")).to_be_visible()
    page.click('#tabs a[data-view="nodes"]')
    row = page.locator(f'tr[data-node-id="{node.node_id}"]')
    expect(row).to_contain_text(HOSTNAME)
    expect(row.locator('[data-role="liveness"]')).to_have_text("offline")
    expect(page.locator("#live")).to_have_text("live", timeout=ARRIVAL_MS)

    # A liveness change appears without a reload: a mark set on the window survives it.
    page.evaluate("window.__notReloaded = true")
    ok(beat(client, node))
    expect(row.locator('[data-role="liveness"]')).to_have_text("online", timeout=ARRIVAL_MS)
    assert patch_node(client, api, node.node_id, enabled=False).status_code == 200
    expect(row.locator('[data-role="liveness"]')).to_have_text("disabled", timeout=ARRIVAL_MS)
    assert patch_node(client, api, node.node_id, enabled=True).status_code == 200
    expect(row.locator('[data-role="liveness"]')).to_have_text("online", timeout=ARRIVAL_MS)
    assert page.evaluate("window.__notReloaded") is True

    # The node's detail: its GPUs (the panel's every part: tests/test_ui_nodes.py).
    for sequence in (1, 2):
        body = telemetry_body(node.node_id, sequence, gpu_uuids=gpu_uuids)
        ok(client.put(TELEMETRY, json=body, headers=node.headers))
    row.click()
    expect(page.locator("#gpus tbody tr")).to_have_count(2)
    expect(page.locator("#node-detail")).to_contain_text("50%")
    page.screenshot(path=SCREENSHOTS / "nodes.png", full_page=True)

    # A job's progress moves on screen as the node reports it.
    job_id = created(client, api, node)
    page.click('#tabs a[data-view="jobs"]')
    job = page.locator(f'tr[data-job-id="{job_id}"]')
    expect(job).to_contain_text("queued", timeout=ARRIVAL_MS)
    claim = claimed(client, node)
    expect(job).to_contain_text("leased", timeout=ARRIVAL_MS)
    ok(progress(client, node, job_id, fence(claim), 1000))
    expect(job.locator('[data-role="progress"]')).to_contain_text("23%", timeout=ARRIVAL_MS)
    ok(progress(client, node, job_id, fence(claim), 3000))
    expect(job.locator('[data-role="progress"]')).to_contain_text("69%", timeout=ARRIVAL_MS)
    assert page.evaluate("window.__notReloaded") is True
    page.screenshot(path=SCREENSHOTS / "jobs.png", full_page=True)

    # The acquisition ends; evicting what it brought is a job of another kind, shown
    # live in the same table (artifact.evict.v1).
    ok(complete(client, node, job_id, fence(claim)))
    expect(job).to_contain_text("succeeded", timeout=ARRIVAL_MS)
    body = {"repository": REPOSITORY, "commit": COMMIT}
    evict = f"{NODES}/{node.node_id}/artifacts/evict"
    eviction_id = ok(client.post(evict, json=body, headers=api.admin_headers), 201)["id"]
    eviction = page.locator(f'tr[data-job-id="{eviction_id}"]')
    expect(eviction).to_contain_text("artifact.evict.v1", timeout=ARRIVAL_MS)
    expect(eviction).to_contain_text("queued")

    for view in ("deployments", "incidents", "audit"):
        page.click(f'#tabs a[data-view="{view}"]')
        expect(page.locator(f"#view-{view}")).to_be_visible()
        if view == "audit":
            expect(page.locator("#audit tbody")).to_contain_text("job.progressed")
        page.wait_for_load_state("networkidle")
        page.screenshot(path=SCREENSHOTS / f"{view}.png", full_page=True)

    # Logout: back to the login page, /ui sends there again, and the old cookie is dead.
    page.click("#logout")
    page.wait_for_url(f"{base}{UI_LOGIN}")
    page.goto(f"{base}{UI_PREFIX}")
    assert page.url == f"{base}{UI_LOGIN}"
    with api.client(cookies={SESSION_COOKIE: session["value"]}) as old:
        assert old.get(NODES).status_code == 401

    assert elsewhere == [], f"the dashboard reached beyond the API: {elsewhere}"
    assert refused == [], refused
    client.close()


def test_the_pages_stream_ends_within_a_keepalive_of_a_logout_elsewhere(
    api_factory: ApiFactory, browser_page: Any
) -> None:
    """The page's EventSource holds the session cookie; a logout of that session from
    another tab (or a copy of the cookie) must end it, not leave it delivering."""
    from playwright.sync_api import expect

    api = api_factory(notification_keepalive_s=KEEPALIVE_S)
    page = browser_page
    signed_in(page, api)
    # The audit view shows each event from the stream itself, with no GET that a
    # revoked cookie would be refused on.
    page.click('#tabs a[data-view="audit"]')
    expect(page.locator("#view-audit")).to_be_visible()
    with api.client() as operator:
        made = operator.post(TOKENS, json={"note": "before"}, headers=api.admin_headers)
        assert made.status_code == 201, made.text
    expect(page.locator("#audit tbody")).to_contain_text("token.created", timeout=ARRIVAL_MS)
    cookies = {c["name"]: c["value"] for c in page.context.cookies()}
    with api.client(cookies={SESSION_COOKIE: cookies[SESSION_COOKIE]}) as other_tab:
        answer = other_tab.post(UI_LOGOUT, headers={CSRF_HEADER: cookies[CSRF_COOKIE]})
        assert answer.status_code == 204
    with api.client() as operator:
        made = operator.post(TOKENS, json={"note": "after"}, headers=api.admin_headers)
        assert made.status_code == 201, made.text
    # The stream ends within a keep-alive; its reconnect (2 s later) is refused and the
    # page goes to the login page. Before, it stayed open and kept showing events.
    page.wait_for_url(f"{api.base_url}{UI_LOGIN}", timeout=(KEEPALIVE_S * 4 + 2 + 5) * 1000)


def test_the_error_bar_shows_the_refusals_code_and_message(
    api: RunningApi, browser_page: Any
) -> None:
    from playwright.sync_api import expect

    page = browser_page
    signed_in(page, api)
    page.click('#tabs a[data-view="nodes"]')
    page.fill('#node-filter input[name="label"]', "not a label!")
    page.press('#node-filter input[name="label"]', "Enter")
    error = page.locator("#error")
    expect(error).to_be_visible(timeout=ARRIVAL_MS)
    # The admin API's error body: {"code", "message", ...} at the top level.
    expect(error).to_have_text(re.compile(r"^422 validation_failed: \S.*"))
    assert "label" in error.inner_text()
