"""The dashboard at 10,000 nodes, in headless Chromium (Debian's /usr/bin/chromium,
driven by Playwright as tests/ui_helpers.py does), against a fresh stack on one box
(embedded PostgreSQL and NATS, `modelforge api`, `modelforge worker`).

    python ops/bench/ui_fleet.py [--nodes 10000] [--heartbeat-interval 60] [--churn 10]

First the baseline, the same page over an empty fleet; then --nodes simulated nodes
(`modelforge simulate`: enrolled, heartbeating every --heartbeat-interval, telemetry
every --telemetry-interval, 2 GPUs each; a few more with a simulated runtime worker, for
the node panel), and per phase:

* first paint, the median and worst of --repeats loads: navigation start to the nodes
  table's page drawn (its rows, or "none" when empty), to the audit log's first page
  (20,000 rows and more at 10k nodes: their tokens and enrollments), and to the
  Overview's first figure, read in the page (performance.now() from a MutationObserver);
* the cost of live updates over --window seconds on the Nodes tab: the page's scripting,
  style and layout time per second (CDP Performance.getMetrics), its requests per
  second, and what changed in the table: rows added or removed (a MutationObserver on
  the tbody: must stay 0, rows are patched in place) against cell edits. Plain
  heartbeats publish no events, so the 10k fleet is measured quiet and then under
  --churn node.updated events per second (label changes, one in five to a row on
  screen).

Then the screenshots docs/ui/overview.png, docs/ui/node-panel.png and docs/ui/usage.png
at that fleet size (--no-screenshots to keep them). The simulated fleet serves no gateway
traffic: for the Usage screenshot an hour of invokes of three service clients is written
the way the gateway's flush writes it (store.rollup.usage.add), and the output says so.
The box's CPUs are shared by the stack, the simulators and the browser: the figures are
the page's as it runs here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import heartbeats as hb  # noqa: E402  (sibling bench module: processes, database)

from schemas.protocol import ADMIN_HEADER, NODES, SERVICE_CLIENTS  # noqa: E402
from schemas.ui import UI_LOGIN, UI_PREFIX  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS = hb.ROOT / "docs" / "ui"
PAINT_TIMEOUT_MS = 30_000
MODELS = ("llama-3-8b", "qwen-2.5-7b")
# Marks set in the page: when the nodes table's page, the audit log's and the Overview's
# first figure were first drawn (ms since navigation start).
MARKS = """
(() => {
  const marks = (window.__marks = {});
  const check = () => {
    const range = document.querySelector('#view-nodes [data-role="range"]');
    if (!marks.nodes && range && range.textContent) marks.nodes = performance.now();
    const audit = document.querySelector('#audit-filter [data-role="range"]');
    if (!marks.audit && audit && audit.textContent) marks.audit = performance.now();
    if (!marks.overview) {
      for (const figure of document.querySelectorAll('#view-overview [data-role="value"]')) {
        if (figure.textContent && figure.textContent !== "\\u2014") {
          marks.overview = performance.now();
          break;
        }
      }
    }
  };
  new MutationObserver(check)
    .observe(document, { subtree: true, childList: true, characterData: true });
})();
"""
WATCH_TABLE = """
() => {
  const body = document.querySelector("#nodes tbody");
  const counts = (window.__mutations = { rows: 0, edits: 0 });
  new MutationObserver((records) => {
    for (const r of records) counts.rows += r.addedNodes.length + r.removedNodes.length;
  }).observe(body, { childList: true });
  new MutationObserver((records) => { counts.edits += records.length; })
    .observe(body, { subtree: true, childList: true, characterData: true, attributes: true });
}
"""
METRICS = ("ScriptDuration", "RecalcStyleDuration", "LayoutDuration", "TaskDuration")


@contextlib.contextmanager
def stack(workdir: Path, env: dict[str, str], interval_s: float) -> Iterator[tuple[str, str, str]]:
    """(API URL, operator key, database URL) of a fresh stack whose liveness fits the
    heartbeat."""
    from stack.embedded_nats import EmbeddedNats

    key = secrets.token_urlsafe(24)
    with hb.database(workdir, False) as (database_url, _), EmbeddedNats(workdir / "nats") as js:
        common = env | {
            "MODELFORGE_DATABASE_URL": database_url,
            "MODELFORGE_NATS_URL": js.url,
            "MODELFORGE_HEARTBEAT_INTERVAL_S": str(interval_s),
            "MODELFORGE_STALE_AFTER_S": str(interval_s * 3),
            "MODELFORGE_OFFLINE_AFTER_S": str(interval_s * 9),
            "MODELFORGE_LOG_LEVEL": "WARNING",
            "MODELFORGE_METRICS_PORT": "0",
        }
        port = hb.free_port()
        api_env = common | {"MODELFORGE_OPERATOR_API_KEY": key, "MODELFORGE_PORT": str(port)}
        url = f"http://127.0.0.1:{port}"
        worker = [sys.executable, "-m", "cli.main", "worker", "--threads", "2"]
        api = [sys.executable, "-m", "cli.main", "api"]
        with (
            hb.child(worker, common, workdir / "worker.log"),
            hb.child(api, api_env, workdir / "api.log") as proc,
        ):
            hb.wait_healthy("the API", url, proc, workdir / "api.log")
            yield url, key, database_url


def simulate(
    url: str, key: str, nodes: int, args: argparse.Namespace, env: dict[str, str], *extra: str
) -> subprocess.Popen[str]:
    """A `modelforge simulate` process, returned once every node of it is enrolled."""
    argv = [
        sys.executable, "-m", "cli.main", "simulate", "--nodes", str(nodes),
        "--api-url", url, "--operator-key", key, "--duration", "0", "--gpus", "2",
        "--heartbeat-interval", str(args.heartbeat_interval),
        "--telemetry-interval", str(args.telemetry_interval),
        "--inventory-interval", "300", "--concurrency", "48", *extra,
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv, cwd=hb.ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    said: list[str] = []
    for line in proc.stdout:
        said = [*said[-20:], line]
        if line.startswith("publishing:"):
            print(f"  {line.strip()}", flush=True)
            # Drained from here on, so the simulator never blocks on a full pipe.
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc
    raise RuntimeError(f"simulate exited {proc.wait()} before enrolling its nodes: {''.join(said)}")


@dataclass
class Live:
    seconds: float
    metrics: dict[str, float]
    requests: int
    rows: int
    edits: int
    events: int
    received: int

    def line(self, label: str) -> str:
        per_s = {name: 1e3 * value / self.seconds for name, value in self.metrics.items()}
        return (
            f"  live, {label}: scripting {per_s['ScriptDuration']:.1f} ms/s, style"
            f" {per_s['RecalcStyleDuration']:.1f} ms/s, layout {per_s['LayoutDuration']:.1f} ms/s"
            f" (main thread busy {per_s['TaskDuration']:.1f} ms/s);"
            f" {self.requests / self.seconds:.2f} requests/s;"
            f" rows added or removed {self.rows}, cell edits {self.edits};"
            f" {self.events / self.seconds:.1f} events/s sent,"
            f" {self.received / self.seconds:.1f} events/s received by the page"
        )


class Page:
    def __init__(self, browser: Any, url: str, key: str) -> None:
        self.url = url
        self.context = browser.new_context(viewport={"width": 1440, "height": 900})
        self.context.add_init_script(MARKS)
        self.page = self.context.new_page()
        self.page.goto(f"{url}{UI_LOGIN}")
        self.page.fill("#operator_key", key)
        self.page.click("#login")
        self.page.wait_for_url(f"{url}{UI_PREFIX}")
        self.requests = 0
        self.page.on("request", self._count)
        self.cdp = self.context.new_cdp_session(self.page)
        self.cdp.send("Performance.enable")
        # The event stream as the page received it (every SSE message, any type).
        self.received = 0
        self.cdp.send("Network.enable")
        self.cdp.on("Network.eventSourceMessageReceived", self._received)

    def _count(self, _: Any) -> None:
        self.requests += 1

    def _received(self, _: Any) -> None:
        self.received += 1

    def first_paint(self, view: str, repeats: int) -> str:
        times = []
        for _ in range(repeats):
            self.page.goto("about:blank")
            self.page.goto(f"{self.url}{UI_PREFIX}#{view}", wait_until="commit")
            try:
                self.page.wait_for_function(
                    f"() => window.__marks && window.__marks.{view}", timeout=PAINT_TIMEOUT_MS
                )
            except Exception:  # a view that never drew: reported, not fatal
                return "not drawn"
            times.append(self.page.evaluate(f"window.__marks.{view}"))
        return (
            f"median {statistics.median(times):.0f} ms, worst {max(times):.0f} ms ({repeats} loads)"
        )

    def metrics(self) -> dict[str, float]:
        answer = self.cdp.send("Performance.getMetrics")["metrics"]
        return {m["name"]: m["value"] for m in answer if m["name"] in METRICS}

    def live(self, window_s: float, churn: Churn | None) -> Live:
        self.page.goto(f"{self.url}{UI_PREFIX}#nodes")
        self.page.wait_for_function(
            "() => window.__marks && window.__marks.nodes", timeout=PAINT_TIMEOUT_MS
        )
        self.page.wait_for_function("() => document.querySelector('#live').textContent === 'live'")
        self.page.evaluate(WATCH_TABLE)
        if churn is not None:
            churn.visible = self.page.eval_on_selector_all(
                "#nodes tbody tr[data-node-id]", "rows => rows.map((r) => r.dataset.nodeId)"
            )
            churn.start()
        before, requests, received = self.metrics(), self.requests, self.received
        started = time.monotonic()
        time.sleep(window_s)
        after, seconds = self.metrics(), time.monotonic() - started
        events = churn.stop() if churn is not None else 0
        counts = self.page.evaluate("window.__mutations")
        return Live(
            seconds=seconds,
            metrics={name: after[name] - before[name] for name in METRICS},
            requests=self.requests - requests,
            rows=counts["rows"],
            edits=counts["edits"],
            events=events,
            received=self.received - received,
        )

    def screenshots(self) -> None:
        page = self.page
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.goto(f"{self.url}{UI_PREFIX}#overview")
        page.wait_for_function(
            "() => window.__marks && window.__marks.overview", timeout=PAINT_TIMEOUT_MS
        )
        with contextlib.suppress(Exception):  # charts drawn, when the view draws any
            page.wait_for_function(
                "() => document.querySelector('#view-overview svg')", timeout=10_000
            )
        page.screenshot(path=SCREENSHOTS / "overview.png", full_page=True)
        page.goto(f"{self.url}{UI_PREFIX}#nodes")
        page.fill('#node-filter input[name="label"]', "bench=runtime")
        page.press('#node-filter input[name="label"]', "Enter")
        page.wait_for_function(
            "() => [...document.querySelectorAll('#nodes tbody tr[data-node-id]')]"
            ".filter((row) => !row.cells[4].textContent.includes('bench=runtime')).length === 0"
            " && document.querySelector('#nodes tbody tr[data-node-id]')",
            timeout=PAINT_TIMEOUT_MS,
        )
        page.eval_on_selector("#nodes tbody tr[data-node-id]", "row => row.click()")
        # Every part read (the panel's GETs answer at their own pace on a loaded box).
        for part in ("facts", "history", "runtime", "deployments", "roots", "artifacts"):
            page.wait_for_selector(
                f'#node-detail [data-part="{part}"] [data-role="body"] > *',
                timeout=PAINT_TIMEOUT_MS,
            )
        page.screenshot(path=SCREENSHOTS / "node-panel.png", full_page=True)
        page.goto(f"{self.url}{UI_PREFIX}#usage")
        with contextlib.suppress(Exception):
            page.wait_for_function(
                "() => document.querySelector('#view-usage').textContent",
                timeout=10_000,
            )
        page.wait_for_timeout(1500)  # the view's own reads
        page.screenshot(path=SCREENSHOTS / "usage.png", full_page=True)


class Churn:
    """node.updated events at a rate: label changes, one in five to a row on screen."""

    def __init__(self, url: str, key: str, rate: float, everyone: list[str]) -> None:
        self.url, self.key, self.rate, self.everyone = url, key, rate, everyone
        self.visible: list[str] = []
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        headers = {ADMIN_HEADER: self.key}
        with httpx.Client(
            base_url=self.url, headers=headers, timeout=10, trust_env=False
        ) as client:
            i = 0
            next_at = time.monotonic()
            while not self._stop.is_set():
                pool = self.visible if self.visible and i % 5 == 0 else self.everyone
                node = pool[(i * 7919) % len(pool)]
                client.patch(f"{NODES}/{node}", json={"labels": {"churn": str(i)}})
                self.sent += 1
                i += 1
                next_at += 1 / self.rate
                self._stop.wait(max(0.0, next_at - time.monotonic()))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=15)
        return self.sent


async def seed_usage(url: str, key: str, database_url: str) -> None:
    """An hour of invokes for the Usage screenshot: three service clients, two models,
    written as the gateway's own flush writes them (store.rollup.usage.add), since the
    simulated fleet serves no gateway traffic of its own. Said so in the output."""
    from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

    from schemas.usage import empty_buckets, ttft_bucket
    from store.rollup.usage import UsageDelta, add

    clients = []
    headers = {ADMIN_HEADER: key}
    async with httpx.AsyncClient(base_url=url, headers=headers, trust_env=False) as http:
        for name in ("chat-frontend", "batch-summaries", "eval-harness"):
            body = {"name": name, "models": list(MODELS)}
            answer = await http.post(SERVICE_CLIENTS, json=body, timeout=30)
            answer.raise_for_status()
            clients.append(uuid.UUID(answer.json()["id"]))
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    deltas = []
    for ago in range(60, 0, -1):
        minute = now - timedelta(minutes=ago)
        for c, client in enumerate(clients):
            for m, model in enumerate(MODELS):
                requests = int(40 * (3 - c) * (1 + m) * (1.2 + math.sin((ago + 9 * c) / 7)))
                ttft = 0.08 * (1 + c) * (1 + m)
                buckets = list(empty_buckets())
                buckets[ttft_bucket(ttft)] = requests
                deltas.append(UsageDelta(
                    minute=minute, client_id=client, model=model, outcome="ok",
                    requests=requests, prompt_tokens=requests * 180,
                    completion_tokens=requests * 95, ttft_count=requests,
                    ttft_sum_s=requests * ttft, ttft_buckets=tuple(buckets),
                ))  # fmt: skip
            if ago % 6 == c:
                deltas.append(UsageDelta(
                    minute=minute, client_id=client, model=MODELS[0],
                    outcome="rate_limited", requests=3 + c, prompt_tokens=0,
                    completion_tokens=0, ttft_count=0, ttft_sum_s=0.0,
                    ttft_buckets=empty_buckets(),
                ))  # fmt: skip
    engine = create_async_engine(database_url)
    try:
        async with async_sessionmaker(engine)() as session, session.begin():
            await add(session, deltas)
    finally:
        await engine.dispose()
    print(
        "  usage: an hour of invokes of 3 service clients written through"
        " store.rollup.usage.add (the gateway's flush), for the screenshot",
        flush=True,
    )


def node_ids(url: str, key: str, count: int) -> list[str]:
    headers = {ADMIN_HEADER: key}
    found: list[str] = []
    with httpx.Client(base_url=url, headers=headers, timeout=30, trust_env=False) as client:
        while len(found) < count:
            page = client.get(NODES, params={"limit": 500, "offset": len(found)}).json()["items"]
            if not page:
                break
            found.extend(node["id"] for node in page)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument(
        "--runtime-nodes", type=int, default=8, help="of them with a runtime worker"
    )
    parser.add_argument("--heartbeat-interval", type=float, default=60.0)
    parser.add_argument("--telemetry-interval", type=float, default=120.0)
    parser.add_argument("--churn", type=float, default=10.0, help="node.updated events per second")
    parser.add_argument(
        "--window", type=float, default=30.0, help="seconds of each live measurement"
    )
    parser.add_argument("--repeats", type=int, default=5, help="loads per first-paint figure")
    parser.add_argument("--no-screenshots", action="store_true")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELFORGE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hb.ROOT), env.get("PYTHONPATH")]))
    workdir = Path(tempfile.mkdtemp(prefix="mf-bench-ui-"))
    sims: list[subprocess.Popen[str]] = []
    try:
        with (
            stack(workdir, env, args.heartbeat_interval) as (url, key, database_url),
            sync_playwright() as pw,
        ):
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
            page = Page(browser, url, key)
            print("empty fleet (the baseline)", flush=True)
            print(
                f"  first paint, nodes table: {page.first_paint('nodes', args.repeats)}", flush=True
            )
            print(
                f"  first paint, overview: {page.first_paint('overview', args.repeats)}", flush=True
            )
            print(
                f"  first paint, audit log: {page.first_paint('audit', args.repeats)}", flush=True
            )
            print(page.live(args.window, None).line("idle"), flush=True)

            started = time.monotonic()
            # The runtime nodes first: the node panel's screenshot is of one of them, with
            # the rollup's minutes of the whole enrollment behind its sparklines.
            runtime = ("--runtime", "--label", "bench=runtime")
            sims.append(simulate(url, key, args.runtime_nodes, args, env, *runtime))
            sims.append(simulate(url, key, args.nodes - args.runtime_nodes, args, env))
            print(f"{args.nodes} nodes enrolled in {time.monotonic() - started:.0f} s"
                  f" (heartbeat every {args.heartbeat_interval:.0f} s,"
                  f" telemetry every {args.telemetry_interval:.0f} s)", flush=True)  # fmt: skip
            print(
                f"  first paint, nodes table: {page.first_paint('nodes', args.repeats)}", flush=True
            )
            print(
                f"  first paint, overview: {page.first_paint('overview', args.repeats)}", flush=True
            )
            print(
                f"  first paint, audit log: {page.first_paint('audit', args.repeats)}", flush=True
            )
            print(page.live(args.window, None).line("heartbeats only (no events)"), flush=True)
            churn = Churn(url, key, args.churn, node_ids(url, key, args.nodes))
            print(page.live(args.window, churn).line(f"{args.churn:g} node.updated/s"), flush=True)
            if not args.no_screenshots:
                # A thread of its own: Playwright's sync API holds this one's event loop.
                with ThreadPoolExecutor(1) as pool:
                    pool.submit(asyncio.run, seed_usage(url, key, database_url)).result()
                page.screenshots()
                print(f"  screenshots in {SCREENSHOTS}", flush=True)
            browser.close()
    except Exception:
        print(f"failed; logs are kept in {workdir}", file=sys.stderr)
        raise
    finally:
        for proc in sims:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
    shutil.rmtree(workdir, ignore_errors=True)
    print(f"\n{os.cpu_count()} CPUs shared by the stack, the simulators and the browser")
    return 0


if __name__ == "__main__":
    sys.exit(main())
