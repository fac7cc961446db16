// The Overview (the landing page): the fleet at a glance and its recent past, drawn from
// the admin API's overview routes (the figures now, and the per-minute rollup the
// control plane keeps in PostgreSQL). It registers itself for app.js, which gives it
// the shared helpers (kit: el, getJson, paths, ...).
//
// Why it is shaped this way:
// - The tiles are built once; a refresh writes their figures and redraws their charts in
//   place, so a live update never rebuilds the page.
// - "Now" is read again on the stream's events that can change it (a node's liveness, a
//   deployment's or a service's state), at most once per NOW_MIN_MS however many events
//   arrive (10,000 nodes can change at once), and every NOW_POLL_MS for the gateway's
//   rates, which no event announces. The history is read once a minute, its step.
// - The charts are drawn by hand in SVG (window.ModelForgeChart, below; usage.js draws
//   with it too): the CSP admits scripts from this origin only, and there is no bundler.
// - Text goes in through textContent only: a state or a name from the API is never markup.
"use strict";

(() => {
  const NS = "http://www.w3.org/2000/svg";

  // -- the chart --------------------------------------------------------------------------
  // lineChart(svg, { times, series: [{ name, values, cls }], from, to, format, unit })
  // draws one line per series over a shared time axis (ms since the epoch), into an
  // existing <svg> (kept, so its place in the page and its hover listener stay). A null
  // value is a gap in the line, not a zero. Hovering shows the time and every series'
  // value at the nearest sample.
  const H = 150, LEFT = 50, RIGHT = 10, TOP = 10, BOTTOM = 22;
  const MINUTE_MS = 60_000;

  function svgEl(tag, attrs, text) {
    const node = document.createElementNS(NS, tag);
    for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
    if (text !== undefined) node.textContent = String(text);
    return node;
  }

  // A round step (1, 2 or 5 times a power of ten) giving about `count` ticks up to max.
  function niceStep(max, count) {
    const raw = max / count;
    const magnitude = 10 ** Math.floor(Math.log10(raw));
    const norm = raw / magnitude;
    return (norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 5 ? 5 : 10) * magnitude;
  }

  // Ticks on whole minutes (whole days past a day) of the local clock, 3 to 6 of them
  // over the span, labelled with the time, or with the date where a step is a day or more.
  const DAY_MIN = 1440;
  const TIME_STEPS_MIN = [1, 2, 5, 10, 15, 30, 60, 120, 180, 240, 360, 720, DAY_MIN, 2 * DAY_MIN, 7 * DAY_MIN, 14 * DAY_MIN];
  function timeTicks(from, to) {
    const span = (to - from) / MINUTE_MS;
    const minutes = TIME_STEPS_MIN.find((m) => span / m <= 6) || TIME_STEPS_MIN[TIME_STEPS_MIN.length - 1];
    const step = minutes * MINUTE_MS;
    const offset = new Date(from).getTimezoneOffset() * MINUTE_MS;
    const ticks = [];
    for (let t = Math.ceil((from - offset) / step) * step + offset; t <= to; t += step) ticks.push(t);
    return { ticks, label: minutes >= DAY_MIN ? day : clock };
  }
  const clock = (ms) => new Date(ms).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", hourCycle: "h23" });
  const day = (ms) => new Date(ms).toLocaleDateString([], { month: "short", day: "numeric" });
  const stamp = (ms) => new Date(ms).toLocaleString([], {
    month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", hourCycle: "h23",
  });

  // The sample nearest to time t (times are ascending).
  function nearest(times, t) {
    let lo = 0, hi = times.length - 1;
    while (hi - lo > 1) {
      const mid = (lo + hi) >> 1;
      if (times[mid] <= t) lo = mid; else hi = mid;
    }
    return Math.abs(times[hi] - t) < Math.abs(times[lo] - t) ? hi : lo;
  }

  function lineChart(svg, { times, series, from, to, format, label, width }) {
    const W = width || 360;
    const fmt = format || ((v) => String(v));
    const values = series.flatMap((s) => s.values).filter((v) => v !== null && v !== undefined);
    const top = Math.max(0, ...values);
    const step = top > 0 ? niceStep(top, 3) : 1;
    const ymax = top > 0 ? Math.ceil(top / step) * step : 1;
    const x = (t) => LEFT + ((t - from) / ((to - from) || 1)) * (W - LEFT - RIGHT);
    const y = (v) => TOP + (1 - v / ymax) * (H - TOP - BOTTOM);

    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    svg.setAttribute("class", "chart");
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", label || "chart");
    svg.setAttribute("data-samples", times.length);
    const grid = svgEl("g", { class: "grid" });
    for (let v = 0; v <= ymax + step / 2; v += step) {
      grid.append(svgEl("line", { x1: LEFT, x2: W - RIGHT, y1: y(v), y2: y(v) }));
      grid.append(svgEl("text", { x: LEFT - 4, y: y(v) + 3, class: "y" }, fmt(v)));
    }
    const { ticks, label: tickLabel } = timeTicks(from, to);
    for (const t of ticks) {
      grid.append(svgEl("line", { x1: x(t), x2: x(t), y1: H - BOTTOM, y2: H - BOTTOM + 3 }));
      grid.append(svgEl("text", { x: x(t), y: H - 6, class: "x" }, tickLabel(t)));
    }
    grid.append(svgEl("line", { class: "axis", x1: LEFT, x2: W - RIGHT, y1: H - BOTTOM, y2: H - BOTTOM }));
    const lines = svgEl("g", { class: "lines" });
    series.forEach((s, i) => {
      // One polyline per unbroken run: a minute with no figure is a gap.
      let run = [];
      const flush = () => {
        if (run.length === 1) lines.append(svgEl("circle", { class: s.cls || `s${i}`, cx: run[0][0], cy: run[0][1], r: 1.5 }));
        else if (run.length) lines.append(svgEl("polyline", { class: s.cls || `s${i}`, points: run.map((p) => p.join(",")).join(" ") }));
        run = [];
      };
      s.values.forEach((v, k) => {
        if (v === null || v === undefined) flush();
        else run.push([x(times[k]).toFixed(1), y(v).toFixed(1)]);
      });
      flush();
    });
    if (!times.length) {
      lines.append(svgEl("text", { x: (W + LEFT) / 2, y: H / 2, class: "empty" }, "no data in this range"));
    }
    const hover = svgEl("g", { class: "hover", visibility: "hidden" });
    const pane = svgEl("rect", { class: "pane", x: LEFT, y: TOP, width: W - LEFT - RIGHT, height: H - TOP - BOTTOM });
    svg.replaceChildren(grid, lines, hover, pane);

    const move = (event) => {
      if (!times.length) return;
      const matrix = svg.getScreenCTM();
      if (!matrix) return;
      const point = new DOMPoint(event.clientX, event.clientY).matrixTransform(matrix.inverse());
      const t = from + ((point.x - LEFT) / (W - LEFT - RIGHT)) * (to - from);
      const k = nearest(times, t);
      const at = x(times[k]);
      const rows = [stamp(times[k]), ...series.map((s) => `${s.name}: ${s.values[k] === null || s.values[k] === undefined ? "—" : fmt(s.values[k])}`)];
      const box = svgEl("rect", { class: "tip" });
      const text = svgEl("text", { class: "tip" });
      rows.forEach((row, r) => text.append(svgEl("tspan", { x: 0, dy: r ? 12 : 0 }, row)));
      const dots = series.map((s, i) => (s.values[k] === null || s.values[k] === undefined ? null
        : svgEl("circle", { class: s.cls || `s${i}`, cx: at, cy: y(s.values[k]), r: 2.5 })));
      hover.replaceChildren(svgEl("line", { x1: at, x2: at, y1: TOP, y2: H - BOTTOM }), ...dots.filter(Boolean), box, text);
      hover.setAttribute("visibility", "visible");
      hover.setAttribute("data-index", k);
      // The box beside the cursor, on whichever side has room.
      const size = text.getBBox();
      const left = at + 8 + size.width + 8 > W ? at - size.width - 16 : at + 8;
      text.setAttribute("transform", `translate(${left + 4},${TOP + 12})`);
      box.setAttribute("x", left);
      box.setAttribute("y", TOP);
      box.setAttribute("width", size.width + 8);
      box.setAttribute("height", size.height + 6);
    };
    svg.onmousemove = move;
    svg.onmouseleave = () => hover.setAttribute("visibility", "hidden");
  }

  // A legend for a chart's series: a swatch and the name (text, never markup).
  function legend(el, series) {
    return series.map((s, i) => el("span", { class: `key ${s.cls || `s${i}`}` }, s.name));
  }

  // A state's name as a class name (the badges' and the lines' colours by state).
  const stateClass = (name) => `st-${String(name).toLowerCase().replace(/[^a-z0-9_-]/g, "_")}`;

  window.ModelForgeChart = { lineChart, legend, stateClass, niceStep };

  // -- formats ----------------------------------------------------------------------------
  const GIB = 2 ** 30;
  const TIB = 2 ** 40;
  const rate = (v) => (Number.isInteger(v) ? String(v) : v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v >= 1 ? v.toFixed(2) : v === 0 ? "0" : v.toPrecision(2));
  const seconds = (v) => (v >= 1 ? `${v.toFixed(2)} s` : v === 0 ? "0" : `${(v * 1000).toFixed(0)} ms`);
  const count = (v) => (Number.isInteger(v) ? String(v) : v.toFixed(1));
  const bytes = (v) => (v >= TIB ? `${(v / TIB).toFixed(1)} TiB` : `${(v / GIB).toFixed(v >= 100 * GIB || v === 0 ? 0 : 1)} GiB`);
  const orNone = (v, f) => (v === null || v === undefined ? "—" : f(v));

  // -- the view ---------------------------------------------------------------------------
  const RANGES = ["1h", "6h", "24h"];
  const RANGE_MS = { "1h": 60 * MINUTE_MS, "6h": 360 * MINUTE_MS, "24h": 1440 * MINUTE_MS };
  const NOW_MIN_MS = 3000;
  const NOW_POLL_MS = 10_000;
  const HISTORY_POLL_MS = 60_000;
  // The events after which "now" may have changed.
  const RELEVANT = /^(node\.|deployment\.|service\.)/;
  // schemas/overview.py: NODE_STATES, SERVICE_HEALTH; schemas/deployments.py: the
  // states of a deployment not ended. Any other state the API adds is drawn after these.
  const LIVENESS = ["online", "stale", "offline", "disabled"];
  const DEPLOYMENT_STATES = ["ready", "loading", "pending", "draining", "unavailable"];
  const SERVICE_STATES = ["ready", "degraded", "unavailable", "idle", "deleting"];

  // A figure counted by state ({state: n}), in "now" and in each history point (null
  // where the rollup has no row for the step: a gap): the known states in their order,
  // then any other, by name.
  const total = (counts) => Object.values(counts || {}).reduce((a, b) => a + b, 0);
  const ordered = (order, names) => [...order.filter((s) => names.has(s)), ...[...names].filter((s) => !order.includes(s)).sort()];
  function stateChart(order, key) {
    return (now, points) => {
      const names = new Set(Object.keys(now[key] || {}));
      for (const p of points) for (const name of Object.keys(p[key] || {})) names.add(name);
      return {
        format: count,
        series: ordered(order, names).map((state) => ({
          name: state, cls: stateClass(state), values: points.map((p) => (p[key] ? p[key][state] ?? 0 : null)),
        })),
      };
    };
  }
  const lines = (format, named) => (_now, points) => ({
    format, series: Object.entries(named).map(([name, pick]) => ({ name, values: points.map((p) => pick(p) ?? null) })),
  });
  const gateway = (now) => now.gateway || {};

  // Each tile: its title, its figure now, what is shown beside it (counts by state, a
  // bar, or a line of text), and its chart.
  const TILES = [
    {
      key: "nodes", title: "Nodes", value: (now) => String(total(now.nodes)),
      counts: (now) => now.nodes || {}, order: LIVENESS, chart: stateChart(LIVENESS, "nodes"),
    },
    {
      key: "gpus", title: "GPUs", value: (now) => String(now.gpus ? now.gpus.count : 0),
      used: (now) => (now.gpus && now.gpus.memory_total_bytes ? now.gpus.memory_used_bytes / now.gpus.memory_total_bytes : 0),
      detail: (now) => {
        const gpus = now.gpus || { memory_used_bytes: 0, memory_free_bytes: 0 };
        const busy = gpus.utilization_percent === null || gpus.utilization_percent === undefined ? ""
          : ` · ${gpus.utilization_percent.toFixed(0)}% busy`;
        return `${bytes(gpus.memory_used_bytes)} used · ${bytes(gpus.memory_free_bytes)} free${busy}`;
      },
      // In GiB or TiB, whichever the largest figure reads best in: round ticks.
      chart: (_now, points) => {
        const top = Math.max(0, ...points.map((p) => (p.gpus ? p.gpus.memory_total_bytes : 0)));
        const [unit, name] = top >= TIB ? [TIB, "TiB"] : [GIB, "GiB"];
        return {
          format: (v) => `${v >= 10 || Number.isInteger(v) ? v.toFixed(0) : v.toFixed(1)} ${name}`,
          series: [
            { name: "memory used", values: points.map((p) => (p.gpus ? p.gpus.memory_used_bytes / unit : null)) },
            { name: "memory total", values: points.map((p) => (p.gpus ? p.gpus.memory_total_bytes / unit : null)) },
          ],
        };
      },
    },
    {
      key: "deployments", title: "Deployments", value: (now) => String(total(now.deployments)),
      counts: (now) => now.deployments || {}, order: DEPLOYMENT_STATES, chart: stateChart(DEPLOYMENT_STATES, "deployments"),
    },
    {
      key: "services", title: "Services", value: (now) => String(total(now.services)),
      counts: (now) => now.services || {}, order: SERVICE_STATES, chart: stateChart(SERVICE_STATES, "services"),
    },
    {
      key: "requests", title: "Requests/s", value: (now) => orNone(gateway(now).requests_per_s, rate),
      detail: () => "the last complete minute",
      chart: lines(rate, { "requests/s": (p) => p.requests_per_s }),
    },
    {
      key: "errors", title: "Errors/s", value: (now) => orNone(gateway(now).errors_per_s, rate),
      // The codes the clients got, the most frequent first.
      detail: (now) => Object.entries(gateway(now).errors || {}).filter(([, v]) => v > 0).sort((a, b) => b[1] - a[1])
        .map(([code, v]) => `${code} ${rate(v)}/s`).join(" · ") || "none",
      chart: lines(rate, { "errors/s": (p) => p.errors_per_s }),
    },
    {
      key: "ttft", title: "TTFT p50 / p99",
      value: (now) => `${orNone(gateway(now).ttft_p50_s, seconds)} / ${orNone(gateway(now).ttft_p99_s, seconds)}`,
      detail: () => "time to first token",
      chart: lines(seconds, { p50: (p) => p.ttft_p50_s, p99: (p) => p.ttft_p99_s }),
    },
    {
      key: "tokens", title: "Tokens/s", value: (now) => orNone(gateway(now).tokens_per_s, rate),
      detail: (now) => `${orNone(gateway(now).prompt_tokens_per_s, rate)} in · ${orNone(gateway(now).completion_tokens_per_s, rate)} out`,
      chart: lines(rate, { in: (p) => p.prompt_tokens_per_s, out: (p) => p.completion_tokens_per_s }),
    },
  ];

  window.ModelForgeViews = window.ModelForgeViews || {};
  window.ModelForgeViews.overview = (kit) => {
    const { el, badge, getJson, showError } = kit;
    const section = document.getElementById("view-overview");
    const asOf = el("span", { class: "muted", "data-role": "as-of" });
    const picker = el("span", { class: "ranges", role: "group", "aria-label": "range" },
      RANGES.map((r) => el("button", { type: "button", "data-range": r, "aria-pressed": r === "1h" ? "true" : "false" }, r)));
    const tiles = new Map(); // key -> { spec, value, breakdown, chart, legend, ...what drawNow keeps }
    const grid = el("div", { class: "tiles" }, TILES.map((spec) => {
      const parts = {
        spec,
        value: el("span", { class: "figure", "data-role": "value" }, "—"),
        breakdown: el("p", { class: "breakdown", "data-role": "breakdown" }),
        chart: document.createElementNS(NS, "svg"),
        legend: el("p", { class: "legend", "data-role": "legend" }),
      };
      tiles.set(spec.key, parts);
      return el("article", { class: "tile", "data-tile": spec.key },
        el("header", {}, el("h3", {}, spec.title), parts.value), parts.breakdown, parts.chart, parts.legend);
    }));
    section.replaceChildren(el("div", { class: "overview-head" }, el("h2", {}, "Fleet"), picker, asOf), grid);

    let range = "1h";
    let now = {};
    let points = [];
    let shown = false;
    let lastNow = 0;
    let nowTimer = null;
    let timers = [];
    let historySeq = 0;
    let nowSeq = 0;

    // The figures written in place: a tile's counts are rebuilt only when its set of
    // states changes, otherwise each count's text is set where it changed.
    function drawCounts(parts, counts) {
      const names = ordered(parts.spec.order, new Set(Object.keys(counts)));
      const same = parts.shownNames && parts.shownNames.join("\n") === names.join("\n");
      if (!same) {
        parts.countText = new Map();
        parts.shownNames = names;
        parts.breakdown.replaceChildren(...(names.length ? names.map((name) => {
          const text = document.createTextNode("");
          parts.countText.set(name, text);
          return el("span", { class: "count", "data-count": name }, badge(name), " ", text);
        }) : [el("span", { class: "muted" }, "none")]));
      }
      for (const name of names) {
        const text = parts.countText.get(name);
        const figure = String(counts[name]);
        if (text.data !== figure) text.data = figure;
        text.parentNode.classList.toggle("zero", !counts[name]);
      }
    }

    function drawNow() {
      for (const parts of tiles.values()) {
        const { spec, value, breakdown } = parts;
        const figure = spec.value(now);
        if (value.textContent !== figure) value.textContent = figure;
        if (spec.counts) {
          drawCounts(parts, spec.counts(now));
        } else if (spec.used) {
          if (!parts.bar) {
            parts.bar = el("span", { class: "bar" }, el("span", {}));
            parts.memory = el("span", { "data-role": "memory" });
            breakdown.replaceChildren(parts.bar, parts.memory);
          }
          // Through the CSSOM: the CSP refuses style attributes.
          parts.bar.firstChild.style.width = `${Math.round(100 * spec.used(now))}%`;
          parts.memory.textContent = spec.detail(now);
        } else if (spec.detail) {
          breakdown.textContent = spec.detail(now);
        }
      }
      asOf.textContent = now.at ? `as of ${new Date(now.at).toLocaleTimeString()}` : "";
    }

    function drawHistory(from, to) {
      const times = points.map((p) => Date.parse(p.start));
      for (const { spec, chart, legend: keys } of tiles.values()) {
        const { series, format } = spec.chart(now, points);
        lineChart(chart, { times, series, from, to, format, label: `${spec.title}, ${range}` });
        keys.replaceChildren(...(series.length > 1 ? legend(el, series) : []));
      }
    }

    async function loadNow() {
      const seq = ++nowSeq;
      lastNow = Date.now();
      const body = await getJson(kit.paths.overview);
      if (seq !== nowSeq) return; // a later read is on its way
      now = body;
      drawNow();
    }

    async function loadHistory() {
      const seq = ++historySeq;
      const body = await getJson(kit.paths.overview_history, { range });
      if (seq !== historySeq) return; // a newer range was picked meanwhile
      points = body.points || [];
      const to = Date.parse(body.until) || Date.now();
      const from = Date.parse(body.since) || to - RANGE_MS[range];
      drawHistory(from, to);
    }

    const failed = (error) => showError(String(error.message || error));

    // "Now" again soon: one read however many events ask, NOW_MIN_MS after the last.
    function wantNow() {
      if (!shown || nowTimer) return;
      const wait = Math.max(0, lastNow + NOW_MIN_MS - Date.now());
      nowTimer = setTimeout(() => {
        nowTimer = null;
        if (shown) loadNow().catch(failed);
      }, wait);
    }

    picker.addEventListener("click", (event) => {
      const button = event.target.closest("button[data-range]");
      if (!button || button.dataset.range === range) return;
      range = button.dataset.range;
      for (const b of picker.querySelectorAll("button")) b.setAttribute("aria-pressed", String(b === button));
      loadHistory().catch(failed);
    });

    async function show() {
      shown = true;
      for (const timer of timers) clearInterval(timer);
      timers = [
        setInterval(wantNow, NOW_POLL_MS),
        setInterval(() => loadHistory().catch(failed), HISTORY_POLL_MS),
      ];
      await Promise.all([loadNow(), loadHistory()]);
    }
    function hide() {
      shown = false;
      for (const timer of timers) clearInterval(timer);
      timers = [];
      clearTimeout(nowTimer);
      nowTimer = null;
    }

    return {
      section,
      show,
      hide,
      refresh: () => Promise.all([loadNow(), loadHistory()]),
      onEvent(event) {
        if (RELEVANT.test(String(event.action))) wantNow();
      },
    };
  };
})();
