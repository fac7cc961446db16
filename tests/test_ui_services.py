"""The dashboard's Services view (issue 32) in headless Chromium (tests/ui_helpers.py):
a service created through the admin API appears in the table without a reload, with
the reconciler's placement receipt (real worker processes: with no node enrolled, "0 of
0 nodes"); scaling it redraws its row and no other; and the text nodes and operators
control (a node's display name in a receipt's message and in the replicas, a replica's
failure detail) is shown as text, never as markup. Real API, workers, NATS, PostgreSQL
and a local server in the Hub's layout (tests/hub_server.py) as the artifact source.

The view's screenshot is written to docs/ui/services.png, as tests/test_ui_dashboard.py
writes the other views'.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from schemas.protocol import DEPLOYMENT_JOB_FAIL, SERVICES
from schemas.services import PlacementReceipt
from store.engine import make_engine, make_sessionmaker
from tests.admin_helpers import ok, patch_node
from tests.api_server import ApiFactory, RunningApi
from tests.deployment_flows import claim_deployment_job, lease_of
from tests.flows import THRESHOLDS, enroll
from tests.hub_server import HubServer
from tests.runtime_flows import create_profile
from tests.service_api_flows import COMMIT, FILES, REPO, add_replica, service_body
from tests.service_flows import create_service, service_node, step
from tests.services import db_fetch, run_async
from tests.ui_helpers import ARRIVAL_MS, signed_in
from tests.worker_processes import OFFLINE_S, STALE_S, Workers

SCREENSHOTS = Path(__file__).resolve().parent.parent / "docs" / "ui"
# Markup an operator or a node could put in text the page shows: executed, it would set
# the flag; interpreted, it would leave an <img> in the view.
HOSTILE = '<img src=x onerror="window.__pwned=1">'


def _create(client: httpx.Client, api: RunningApi, profile_id: str, **extra: Any) -> str:
    body = service_body(profile_id, **extra)
    created: dict[str, Any] = ok(client.post(SERVICES, json=body, headers=api.admin_headers), 201)
    return str(created["id"])


def _scale(client: httpx.Client, api: RunningApi, service_id: str, replicas: int) -> None:
    path = f"{SERVICES}/{service_id}/scale"
    ok(client.post(path, json={"replicas": replicas}, headers=api.admin_headers))


def _services_tab(page: Any, api: RunningApi) -> None:
    from playwright.sync_api import expect

    signed_in(page, api)
    page.click('#tabs a[data-view="services"]')
    expect(page.locator("#view-services")).to_be_visible()
    page.wait_for_load_state("networkidle")
    # A mark on the window that a reload would lose.
    page.evaluate("window.__notReloaded = true")


@pytest.fixture
def sourced(hub: HubServer) -> HubServer:
    hub.state.add(REPO, "main", COMMIT, FILES)
    return hub


def test_a_service_appears_with_its_receipt_and_scales_live(
    api_factory: ApiFactory, workers: Workers, sourced: HubServer, browser_page: Any
) -> None:
    from playwright.sync_api import expect

    workers.start(1)
    # The workers relay the events and run the service reconciler (no pipeline here).
    api = api_factory(
        stale_after_s=STALE_S,
        offline_after_s=OFFLINE_S,
        nats_url=workers.env["MODELFORGE_NATS_URL"],
        broker_namespace=workers.env["MODELFORGE_NAMESPACE"],
        pipeline=False,
        artifact_source_url=sourced.url,
    )
    page = browser_page
    with api.client() as client:
        profile = create_profile(client, api)["id"]
        # No replicas: nothing to place, so no event of its own will redraw its row.
        quiet = _create(client, api, profile, name="quiet", replicas=0)
        # Its service.created relayed and audited before the page's stream opens: the
        # page must not receive it (that would rightly redraw its row).
        api.settle()
        _services_tab(page, api)
        quiet_row = page.locator(f'tr[data-service-id="{quiet}"]')
        expect(quiet_row).to_contain_text("quiet")
        expect(quiet_row.locator('[data-role="replicas"]')).to_have_text("0/0")
        # What it serves: the default two.
        expect(quiet_row.locator('[data-role="endpoints"]')).to_have_text("chat, completions")
        quiet_row.evaluate("row => { row.__same = true; }")

        served = _create(
            client, api, profile, name="served", replicas=1, endpoints=["embeddings", "chat"]
        )
        row = page.locator(f'tr[data-service-id="{served}"]')
        expect(row).to_contain_text("served", timeout=ARRIVAL_MS)
        expect(row.locator('[data-role="replicas"]')).to_have_text("0/1")
        expect(row.locator('[data-role="endpoints"]')).to_have_text("chat, embeddings")
        # The reconciler's decision, with no node to place on.
        receipt = row.locator('[data-role="receipt"]')
        expect(receipt).to_contain_text("unplaceable", timeout=ARRIVAL_MS)
        expect(receipt).to_contain_text("0 of 0 nodes")

        _scale(client, api, served, 3)
        expect(row.locator('[data-role="replicas"]')).to_have_text("0/3", timeout=ARRIVAL_MS)
        expect(row.locator('[data-role="rollout"]')).to_contain_text("0/3")

        # The panel: the last receipt's reasons counted, and a scale shown there live.
        row.click()
        panel = page.locator("#service-detail")
        expect(panel.locator('[data-role="receipt-counts"]')).to_have_text("0 of 0 nodes")
        expect(panel.locator('[data-role="receipt-message"]')).to_contain_text("0 of 0 nodes")
        expect(panel.locator('[data-role="rollout-progress"]')).to_contain_text("0/3 updated")
        expect(panel.locator('[data-role="endpoints"]')).to_have_text("chat, embeddings")
        _scale(client, api, served, 2)
        expect(panel.locator('[data-role="rollout-progress"]')).to_contain_text(
            "0/2 updated", timeout=ARRIVAL_MS
        )
        expect(row.locator('[data-role="replicas"]')).to_have_text("0/2", timeout=ARRIVAL_MS)
        # A node enrolled (offline until it beats): the reconciler's next decision counts
        # it, and the row and the panel show that decision without a reload.
        enroll(client, api, hostname="gpu-svc-02")
        expect(panel.locator('[data-role="receipt-counts"]')).to_have_text(
            "0 of 1 nodes: 1 offline", timeout=ARRIVAL_MS
        )
        expect(receipt).to_contain_text("0 of 1 nodes: 1 offline", timeout=ARRIVAL_MS)
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=SCREENSHOTS / "services.png", full_page=True)

    # Neither a creation nor another service's changes drew the quiet row again.
    assert quiet_row.evaluate("row => row.__same === true") is True
    assert page.evaluate("window.__notReloaded") is True

    # The state filter is the API's: none deleted, both active.
    state = page.locator('#service-filter select[name="state"]')
    state.select_option("deleted")
    page.click('#service-filter button[type="submit"]')
    expect(page.locator("#services tbody tr")).to_have_count(0)
    state.select_option("active")
    page.click('#service-filter button[type="submit"]')
    expect(page.locator("#services tbody tr")).to_have_count(2)


def _receipt(message: str, node_id: str) -> str:
    """A placed receipt as the reconciler writes one (store/services/placement.py names
    the node by its display name in the message)."""
    return PlacementReceipt(
        decided_at=datetime.now(UTC),
        outcome="placed",
        node_id=uuid.UUID(node_id),
        device_id="cuda:0",
        nodes_considered=1,
        feasible=1,
        message=message,
    ).model_dump_json()


def test_operator_and_node_text_is_shown_as_text(
    api_factory: ApiFactory, sourced: HubServer, browser_page: Any
) -> None:
    """The replica and receipt are written as the reconciler writes them (no reconciler
    runs here: its placement would need a runtime), with markup in every text a node or
    an operator controls; the page is opened after, and a scale redraws the panel."""
    from playwright.sync_api import expect

    api = api_factory(artifact_source_url=sourced.url)
    page = browser_page
    dialogs: list[str] = []

    def dismissed(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", dismissed)
    with api.client() as client:
        profile = create_profile(client, api)["id"]
        node = enroll(client, api, hostname="gpu-svc-01")
        assert patch_node(client, api, node.node_id, display_name=HOSTILE).status_code == 200
        served = _create(client, api, profile, name="served", replicas=1)
        replica = add_replica(api, served, node.node_id, "cuda:0", generation=1, phase="loading")
        receipt = _receipt(f"placed on {HOSTILE} cuda:0 (1 of 1 nodes feasible)", node.node_id)
        run_async(
            lambda: db_fetch(
                api.settings.database_url,
                "UPDATE service_replicas SET receipt = $2::jsonb, failure_code = 'load_failed',"
                " failure_detail = $3 WHERE id = $1",
                uuid.UUID(replica),
                receipt,
                f"llama-server said {HOSTILE}",
            )
        )
        run_async(
            lambda: db_fetch(
                api.settings.database_url,
                "UPDATE services SET last_receipt = $2::jsonb WHERE id = $1",
                uuid.UUID(served),
                receipt,
            )
        )

        _services_tab(page, api)
        row = page.locator(f'tr[data-service-id="{served}"]')
        expect(row.locator('[data-role="receipt"]')).to_contain_text(f"placed on {HOSTILE}")
        row.click()
        panel = page.locator("#service-detail")
        message = panel.locator('[data-role="receipt-message"]')
        expect(message).to_have_text(f"placed on {HOSTILE} cuda:0 (1 of 1 nodes feasible)")
        replica_row = panel.locator(f'tr[data-replica-id="{replica}"]')
        expect(replica_row.locator('[data-role="node"]')).to_contain_text(HOSTILE)
        expect(replica_row.locator('[data-role="failure"]')).to_have_text(
            f"load_failed: llama-server said {HOSTILE}"
        )
        expect(replica_row.locator('[data-role="replica-receipt"]')).to_contain_text(HOSTILE)

        # The panel follows the service's events while it is open.
        _scale(client, api, served, 2)
        expect(panel).to_contain_text("of 2 replicas ready", timeout=ARRIVAL_MS)

        # The next replica could not be placed: the panel counts the receipt's reasons
        # as the scheduler's own message does, the largest count first, and the row
        # shows the message.
        refusal = (
            "0 of 11 nodes: 7 selector,"
            " 2 insufficient memory (needs 9.0 GiB, best 7.5 GiB), 1 offline, 1 backoff"
        )
        unplaceable = PlacementReceipt(
            decided_at=datetime.now(UTC),
            outcome="unplaceable",
            nodes_considered=11,
            feasible=0,
            # Equal counts in the scheduler's order (offline before backoff).
            rejected={"backoff": 1, "offline": 1, "insufficient_memory": 2, "selector": 7},
            needs_bytes=9 * 2**30,
            best_free_bytes=int(7.5 * 2**30),
            message=refusal,
        ).model_dump_json()
        run_async(
            lambda: db_fetch(
                api.settings.database_url,
                "UPDATE services SET last_receipt = $2::jsonb WHERE id = $1",
                uuid.UUID(served),
                unplaceable,
            )
        )
        _scale(client, api, served, 3)
        counts = panel.locator('[data-role="receipt-counts"]')
        expect(counts).to_have_text(refusal, timeout=ARRIVAL_MS)
        expect(row.locator('[data-role="receipt"]')).to_have_text(f"unplaceable {refusal}")

    assert page.locator("#view-services img").count() == 0
    assert page.evaluate("window.__pwned") is None
    assert dialogs == []
    assert page.evaluate("window.__notReloaded") is True
    assert json.loads(receipt)["message"].startswith("placed on <img")


T = TypeVar("T")


def _in_store(api: RunningApi, work: Callable[[Any], Awaitable[T]]) -> T:
    """Run a store-level step (the reconciler's pass, a service declared through the
    rules) against the test's database, on a loop and an engine of its own."""

    async def run() -> T:
        engine = make_engine(api.settings.database_url, pool_size=2)
        try:
            return await work(make_sessionmaker(engine))
        finally:
            await engine.dispose()

    return run_async(run)


def test_a_placed_replica_and_its_failed_load_show_the_nodes_text_as_text(
    api_factory: ApiFactory, browser_page: Any
) -> None:
    """The whole way, with the reconciler's pass run here (tests/service_flows.py: step)
    and the node's side over the real protocol: the placed receipt names the node by its
    display name (markup), the replica is shown loading on it, the node fails the load
    with markup in its detail, and the ended replica shows that failure; each change
    reaches the page by the service's events alone."""
    from playwright.sync_api import expect

    api = api_factory(
        stale_after_s=THRESHOLDS.stale_after_s,
        offline_after_s=THRESHOLDS.offline_after_s,
        job_retry_base_s=0.1,
    )
    page = browser_page
    with api.client() as client:
        node = service_node(client, api, "gpu-svc-03")
        assert patch_node(client, api, str(node.node_id), display_name=HOSTILE).status_code == 200
        profile = create_profile(client, api)["id"]
        _services_tab(page, api)
        service_id = str(_in_store(api, lambda sessions: create_service(sessions, profile)))
        row = page.locator(f'tr[data-service-id="{service_id}"]')
        expect(row).to_contain_text("smol", timeout=ARRIVAL_MS)
        row.click()
        panel = page.locator("#service-detail")
        expect(panel.locator('[data-role="last-receipt"]')).to_contain_text("No placement")

        node.beat(client)
        node.report(client)
        _in_store(api, step)
        receipt = row.locator('[data-role="receipt"]')
        expect(receipt).to_contain_text(f"placed on {HOSTILE} cpu", timeout=ARRIVAL_MS)
        live = panel.locator("#replicas tbody tr[data-replica-id]")
        expect(live).to_have_count(1, timeout=ARRIVAL_MS)
        expect(live.locator('[data-role="phase"]')).to_have_text("loading")
        expect(live.locator('[data-role="node"]')).to_contain_text(HOSTILE)
        placed = live.locator('[data-role="replica-receipt"]')
        expect(placed).to_contain_text(f"placed on {HOSTILE}")
        replica_id = live.get_attribute("data-replica-id")

        # The node fails the load for good, with markup in what it says.
        claim = claim_deployment_job(client, node.node)
        body = {
            "lease": lease_of(claim),
            "code": "out_of_memory",
            "retryable": False,
            "detail": f"llama-server: {HOSTILE}",
        }
        path = DEPLOYMENT_JOB_FAIL.format(job_id=claim["job_id"])
        ok(client.post(path, json=body, headers=node.node.headers))
        node.beat(client)
        _in_store(api, step)
        ended = panel.locator(f'#ended-replicas tr[data-replica-id="{replica_id}"]')
        expect(ended.locator('[data-role="failure"]')).to_have_text(
            f"out_of_memory: llama-server: {HOSTILE}", timeout=ARRIVAL_MS
        )
        expect(ended.locator('[data-role="phase"]')).to_contain_text("ended")
        expect(ended.locator('[data-role="node"]')).to_contain_text(HOSTILE)

    assert page.locator("#view-services img").count() == 0
    assert page.evaluate("window.__pwned") is None
    assert page.evaluate("window.__notReloaded") is True
