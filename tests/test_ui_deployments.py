"""The Deployments tab in headless Chromium: each row shows what the deployment serves
(issue 34: its endpoints) and whether its loaded chat template calls tools (unknown
before a load); a load its node completes, with the capabilities it reports, changes
that one row over the event stream, without a reload and without drawing the other rows
again. Real API, relay, NATS and PostgreSQL; the test acts as the node; the browser
comes from tests/ui_helpers.py."""

from __future__ import annotations

from typing import Any

from schemas.protocol import DEPLOYMENT_JOB_COMPLETE
from tests.admin_helpers import ok
from tests.api_server import RunningApi
from tests.deployment_flows import (
    HEALTHY,
    beat,
    claim_deployment_job,
    create_deployment,
    deployment_body,
    lease_of,
)
from tests.runtime_flows import create_profile, environment_id, ready_node
from tests.ui_helpers import ARRIVAL_MS, signed_in

CAPS = {"supports_tools": True, "supports_tool_calls": True, "supports_parallel_tool_calls": True}


def test_deployments_show_their_endpoints_and_tool_calls_live(
    api: RunningApi, browser_page: Any
) -> None:
    from playwright.sync_api import expect

    page = browser_page
    with api.client() as client:
        node = ready_node(client, api, hostname="endpoints-ui")
        beat(client, node)
        profile = create_profile(client, api, name="endpoints-ui")
        body = deployment_body(node, profile["id"], environment_id(client, api))
        embedder = create_deployment(client, api, {**body, "endpoints": ["embeddings", "chat"]})
        other = create_deployment(client, api, {**body, "model": "other"})
        api.settle()

    signed_in(page, api)
    page.click('#tabs a[data-view="deployments"]')
    row = page.locator(f'tr[data-deployment-id="{embedder["id"]}"]')
    expect(row.locator('[data-role="endpoints"]')).to_have_text("chat, embeddings")
    expect(row.locator('[data-role="tool-calls"]')).to_have_text("unknown")
    other_row = page.locator(f'tr[data-deployment-id="{other["id"]}"]')
    expect(other_row.locator('[data-role="endpoints"]')).to_have_text("chat, completions")
    rows = {embedder["id"]: row, other["id"]: other_row}
    page.evaluate("window.__notReloaded = true")

    # The node loads one and reports its template's caps: that row changes live, the
    # other is not drawn again.
    with api.client() as client:
        claim = claim_deployment_job(client, node)
        loaded = claim["spec"]["deployment_id"]
        [untouched] = [rows[key] for key in rows if key != loaded]
        untouched.evaluate("row => { row.__same = true; }")
        done = {"kind": "deployment.load.v1", "lease": lease_of(claim), "device_id": "cpu",
                "health": HEALTHY, "load_s": 0.3, "capabilities": CAPS}  # fmt: skip
        path = DEPLOYMENT_JOB_COMPLETE.format(job_id=claim["job_id"])
        ok(client.post(path, json=done, headers=node.headers))
    expect(rows[loaded].locator('[data-role="tool-calls"]')).to_have_text(
        "yes, in parallel", timeout=ARRIVAL_MS
    )
    expect(rows[loaded]).to_contain_text("ready")
    expect(row.locator('[data-role="endpoints"]')).to_have_text("chat, embeddings")
    expect(untouched.locator('[data-role="tool-calls"]')).to_have_text("unknown")
    assert untouched.evaluate("row => row.__same === true") is True
    assert page.evaluate("window.__notReloaded") is True
