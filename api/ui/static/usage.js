// Usage: what each service client used of each served model, from the admin usage route
// (schemas/usage.py: UsageReport, read from the per-minute rollup). It registers itself
// for app.js, as overview.js does, and draws with overview.js's chart.
//
// - One report per range and filters: its rows (one per bucket, client and model) give
//   the charts (a line per client, buckets with no row are zeros) and the table's counts.
// - A percentile does not add up across buckets: the table's TTFT p50/p99 per client and
//   model are that pair's totals over the whole range, one small filtered read each (the
//   rollup sums their TTFT buckets), for the first TTFT_PAIRS pairs.
// - Client names and models are text an operator chose: textContent only.
"use strict";

(() => {
  const MINUTE_MS = 60_000;
  // Range -> [length, step]: a few hundred buckets at most per line.
  const RANGES = {
    "1h": [60 * MINUTE_MS, "minute"],
    "6h": [360 * MINUTE_MS, "minute"],
    "24h": [1440 * MINUTE_MS, "hour"],
    "7d": [7 * 1440 * MINUTE_MS, "hour"],
    "30d": [30 * 1440 * MINUTE_MS, "day"],
  };
  const STEP_MS = { minute: MINUTE_MS, hour: 60 * MINUTE_MS, day: 1440 * MINUTE_MS };
  const ROW_LIMIT = 10_000;
  const LINES = 7; // clients drawn one line each (colours s0-s6); the rest one "others" line (s7)
  const TTFT_PAIRS = 50;
  const TTFT_PARALLEL = 4;
  const POLL_MS = 60_000;

  const seconds = (v) => (v === null || v === undefined ? "—" : v >= 1 ? `${v.toFixed(2)} s` : `${(v * 1000).toFixed(0)} ms`);
  const count = (v) => (Number.isInteger(v) ? v.toLocaleString() : v.toFixed(1));
  const errorsText = (errors) => Object.entries(errors).sort((a, b) => b[1] - a[1])
    .map(([code, n]) => `${code} ${n}`).join(", ") || "—";

  window.ModelForgeViews = window.ModelForgeViews || {};
  window.ModelForgeViews.usage = (kit) => {
    const { el, short, getJson, showError } = kit;
    const { lineChart, legend } = window.ModelForgeChart;
    const section = document.getElementById("view-usage");
    const select = (name, options) => el("select", { name }, options.map(([value, text]) => el("option", { value }, text)));
    const rangeBox = select("range", Object.keys(RANGES).map((r) => [r, `last ${r}`]));
    const clientBox = select("client", [["", "every client"]]);
    const modelBox = select("model", [["", "every model"]]);
    const form = el("form", { id: "usage-filter", class: "filters" },
      el("label", {}, "Range ", rangeBox), el("label", {}, "Client ", clientBox), el("label", {}, "Model ", modelBox),
      el("button", { type: "submit" }, "Refresh"),
      el("span", { class: "muted", "data-role": "note" }));
    const note = form.querySelector('[data-role="note"]');
    const charts = {};
    const figure = (key, caption) => {
      charts[key] = { svg: document.createElementNS("http://www.w3.org/2000/svg", "svg"), keys: el("p", { class: "legend" }) };
      return el("figure", { "data-chart": key }, el("figcaption", {}, caption), charts[key].svg, charts[key].keys);
    };
    const body = el("tbody");
    const foot = el("tfoot");
    const headings = ["Client", "Model", "Requests", "Errors", "Tokens in", "Tokens out", "TTFT p50", "TTFT p99"];
    section.replaceChildren(form,
      el("div", { class: "usage-charts" }, figure("requests", "Requests per client"), figure("tokens", "Tokens per client (in + out)")),
      el("table", { id: "usage", class: "grid" },
        el("thead", {}, el("tr", {}, headings.map((h, i) => el("th", { class: i > 1 ? "num" : null }, h)))), body, foot));

    const clients = new Map(); // id -> name, every client seen in a report
    const models = new Set();
    const lastTtft = new Map(); // pair and range -> [p50, p99] as last shown
    let timer = null;
    let seq = 0;

    // The filters' choices: the clients and models seen so far (a client or model that
    // never invoked anything has nothing to show), the choice kept across reports.
    function learn(rows) {
      let grew = false;
      for (const row of rows) {
        if (!clients.has(row.client_id) || (row.client_name && clients.get(row.client_id) !== row.client_name)) {
          clients.set(row.client_id, row.client_name || short(row.client_id));
          grew = true;
        }
        if (!models.has(row.model)) { models.add(row.model); grew = true; }
      }
      if (!grew) return;
      const keep = [clientBox.value, modelBox.value];
      clientBox.replaceChildren(el("option", { value: "" }, "every client"),
        ...[...clients].sort((a, b) => a[1].localeCompare(b[1])).map(([id, name]) => el("option", { value: id }, name)));
      modelBox.replaceChildren(el("option", { value: "" }, "every model"),
        ...[...models].sort().map((m) => el("option", { value: m }, m)));
      [clientBox.value, modelBox.value] = keep;
    }

    function draw(report) {
      const from = Date.parse(report.since);
      const to = Date.parse(report.until);
      const step = STEP_MS[report.step];
      const times = [];
      for (let t = Math.floor(from / step) * step; t < to; t += step) times.push(t);
      const index = new Map(times.map((t, i) => [t, i]));
      // Per client: requests and tokens per bucket.
      const per = new Map();
      for (const row of report.rows) {
        const i = index.get(Date.parse(row.start));
        if (i === undefined) continue;
        if (!per.has(row.client_id)) per.set(row.client_id, { total: 0, requests: times.map(() => 0), tokens: times.map(() => 0) });
        const line = per.get(row.client_id);
        line.total += row.requests;
        line.requests[i] += row.requests;
        line.tokens[i] += row.prompt_tokens + row.completion_tokens;
      }
      const ranked = [...per].sort((a, b) => b[1].total - a[1].total);
      const drawn = ranked.slice(0, LINES).map(([id, line], i) => ({ name: clients.get(id) || short(id), cls: `s${i}`, ...line }));
      if (ranked.length > LINES) {
        const others = ranked.length - LINES;
        const rest = { name: `${others} other client${others === 1 ? "" : "s"}`, cls: "s7", requests: times.map(() => 0), tokens: times.map(() => 0) };
        for (const [, line] of ranked.slice(LINES)) {
          line.requests.forEach((v, i) => { rest.requests[i] += v; });
          line.tokens.forEach((v, i) => { rest.tokens[i] += v; });
        }
        drawn.push(rest);
      }
      for (const key of ["requests", "tokens"]) {
        const series = drawn.map((line) => ({ name: line.name, cls: line.cls, values: line[key] }));
        lineChart(charts[key].svg, {
          times: series.length ? times : [], series, from: times.length ? times[0] : from, to, format: count, label: `${key} per client`, width: 520,
        });
        charts[key].keys.replaceChildren(...legend(el, series));
      }
    }

    // The table: one row per client and model, counts summed over the range's buckets.
    function tabulate(report) {
      const pairs = new Map();
      for (const row of report.rows) {
        const key = `${row.client_id}\n${row.model}`;
        if (!pairs.has(key)) pairs.set(key, { client_id: row.client_id, model: row.model, requests: 0, errors: {}, prompt: 0, completion: 0 });
        const pair = pairs.get(key);
        pair.requests += row.requests;
        pair.prompt += row.prompt_tokens;
        pair.completion += row.completion_tokens;
        for (const [code, n] of Object.entries(row.errors)) pair.errors[code] = (pair.errors[code] || 0) + n;
      }
      const sorted = [...pairs.values()].sort((a, b) => b.requests - a.requests);
      const rows = sorted.map((pair) => {
        // The pair's last figures until its new ones come: a refresh does not blink.
        pair.key = `${rangeBox.value}\n${pair.client_id}\n${pair.model}`;
        const [p50, p99] = lastTtft.get(pair.key) || ["…", "…"];
        pair.cells = { p50: el("td", { class: "num", "data-role": "p50" }, p50), p99: el("td", { class: "num", "data-role": "p99" }, p99) };
        return el("tr", { "data-client-id": pair.client_id, "data-model": pair.model },
          el("td", { "data-role": "client" }, clients.get(pair.client_id) || short(pair.client_id)),
          el("td", { "data-role": "model" }, pair.model),
          el("td", { class: "num", "data-role": "requests" }, count(pair.requests)),
          el("td", { class: "num", "data-role": "errors" }, errorsText(pair.errors)),
          el("td", { class: "num", "data-role": "prompt" }, count(pair.prompt)),
          el("td", { class: "num", "data-role": "completion" }, count(pair.completion)),
          pair.cells.p50, pair.cells.p99);
      });
      body.replaceChildren(...(rows.length ? rows
        : [el("tr", {}, el("td", { colspan: headings.length, class: "muted" }, "No invokes in this range."))]));
      const t = report.totals;
      foot.replaceChildren(el("tr", { "data-role": "totals" }, el("td", {}, "Total"), el("td", {}),
        el("td", { class: "num" }, count(t.requests)), el("td", { class: "num" }, errorsText(t.errors)),
        el("td", { class: "num" }, count(t.prompt_tokens)), el("td", { class: "num" }, count(t.completion_tokens)),
        el("td", { class: "num" }, seconds(t.ttft_p50_s)), el("td", { class: "num" }, seconds(t.ttft_p99_s))));
      return sorted;
    }

    // Each shown pair's percentiles over the whole range, a few reads at a time.
    async function percentiles(pairs, params, mine) {
      const queue = pairs.slice(0, TTFT_PAIRS);
      for (const pair of pairs.slice(TTFT_PAIRS)) { pair.cells.p50.textContent = "—"; pair.cells.p99.textContent = "—"; }
      const worker = async () => {
        for (let pair = queue.shift(); pair; pair = queue.shift()) {
          const report = await getJson(kit.paths.usage, { ...params, client: pair.client_id, model: pair.model, limit: 1 });
          if (mine !== seq) return;
          const figures = [seconds(report.totals.ttft_p50_s), seconds(report.totals.ttft_p99_s)];
          [pair.cells.p50.textContent, pair.cells.p99.textContent] = figures;
          lastTtft.set(pair.key, figures);
        }
      };
      await Promise.all(Array.from({ length: TTFT_PARALLEL }, worker));
    }

    async function reload() {
      const mine = ++seq;
      const [length, step] = RANGES[rangeBox.value];
      const until = new Date();
      const params = { since: new Date(until.getTime() - length).toISOString(), until: until.toISOString(), step };
      const report = await getJson(kit.paths.usage, {
        ...params, client: clientBox.value, model: modelBox.value, limit: ROW_LIMIT,
      });
      if (mine !== seq) return; // the filters changed meanwhile: a newer report is coming
      learn(report.rows);
      draw(report);
      const pairs = tabulate(report);
      note.textContent = report.truncated ? `More than ${ROW_LIMIT.toLocaleString()} rows: narrow the range or the filters.` : "";
      await percentiles(pairs, params, mine);
    }
    const failed = (error) => showError(String(error.message || error));
    form.addEventListener("submit", (event) => { event.preventDefault(); reload().catch(failed); });
    form.addEventListener("change", () => reload().catch(failed));

    return {
      section,
      // Usage is flushed by each API process every few seconds and rolled up per
      // minute: read again each minute while shown, not on events (there are none).
      show: () => {
        clearInterval(timer);
        timer = setInterval(() => reload().catch(failed), POLL_MS);
        return reload();
      },
      hide: () => { clearInterval(timer); timer = null; },
      refresh: reload,
      onEvent(event) {
        // A client renamed or created: its name in the filter on the next read.
        if (String(event.action).startsWith("service_client.") && timer) kit.coalesce("usage:clients", reload);
      },
    };
  };
})();
