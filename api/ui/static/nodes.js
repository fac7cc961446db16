// The Nodes tab and its node panel, registered for app.js as overview.js is. Why it is
// shaped this way:
// - One server-side page of nodes (limit/offset, the API's own filters); a row on screen
//   is updated in place, cell by cell, from one GET of that node: the table's rows are
//   never replaced, so a fleet's stream of changes costs text edits, not re-layouts.
// - Plain heartbeats publish no events: the page on screen is read again every
//   PAGE_POLL_MS (one paged GET) and patched in place, so "last heartbeat" stays true.
// - The panel's sparklines start from the per-minute rollup (the node's history route)
//   and go on from the telemetry read while the panel is open, folded into the current
//   minute so the line keeps one scale.
"use strict";

(() => {
  const DETAIL_POLL_MS = 5000;
  const PAGE_POLL_MS = 10000;
  const SPARK_POINTS = 60;
  const DEPLOYMENTS_SHOWN = 20;
  const GiB = 2 ** 30;

  window.ModelForgeViews = window.ModelForgeViews || {};
  window.ModelForgeViews.nodes = (kit) => {
    const { el, short, ago, badge, getJson, coalesce, showError } = kit;
    const section = document.getElementById("view-nodes");
    const form = document.getElementById("node-filter");
    const offscreen = section.querySelector('[data-role="offscreen"]');
    const panel = document.getElementById("node-detail");
    let unseen = 0;
    let poll = null;
    let detail = null; // { id, timer, series: Map(key -> [{minute, value, n}]) }

    const labelsOf = (labels) => Object.entries(labels).map(([k, v]) => `${k}=${v}`).join(" ");
    // The cells a row is patched through: text changed only where it differs.
    function setText(cell, text) {
      if (cell.textContent === text) return false;
      cell.textContent = text;
      return true;
    }
    // True when something the operator reads changed (the row flashes then).
    function patch(row, node) {
      const cells = row.cells;
      let changed = setText(cells[0], node.display_name || node.hostname);
      const liveness = cells[2].firstElementChild;
      if (liveness.textContent !== node.liveness) {
        liveness.textContent = node.liveness;
        liveness.className = `badge ${node.liveness}`;
        changed = true;
      }
      changed = setText(cells[3], node.enabled ? "yes" : "no") || changed;
      changed = setText(cells[4], labelsOf(node.labels)) || changed;
      changed = setText(cells[5], node.agent_version) || changed;
      kit.setAgo(cells[6].firstElementChild, node.last_heartbeat_at);
      return changed;
    }

    const table = kit.pagedTable({
      section,
      table: "nodes",
      keyOf: (node) => node.id,
      // One more than a page tells whether there is a next one, without a count query.
      load: async (offset) => {
        const filter = new FormData(form);
        const body = await getJson(kit.paths.nodes, {
          limit: kit.PAGE + 1, offset, liveness: filter.get("liveness"), label: filter.get("label").trim(),
        });
        return body.items;
      },
      rowOf: (node) => {
        const row = el("tr", { "data-node-id": node.id },
          el("td", {}, node.display_name || node.hostname),
          el("td", { class: "mono" }, short(node.id)),
          el("td", { "data-role": "liveness" }, badge(node.liveness)),
          el("td", {}, node.enabled ? "yes" : "no"),
          el("td", { class: "mono" }, labelsOf(node.labels)),
          el("td", {}, node.agent_version),
          el("td", { "data-role": "heartbeat" }, ago(node.last_heartbeat_at)));
        row.addEventListener("click", () => openDetail(node.id));
        return row;
      },
      patch,
    });

    function countUnseen() {
      unseen += 1;
      offscreen.hidden = false;
      offscreen.textContent = `${unseen} change${unseen === 1 ? "" : "s"} elsewhere in the fleet · refresh`;
    }
    async function reload() {
      unseen = 0;
      offscreen.hidden = true;
      await table.reload();
    }
    offscreen.addEventListener("click", () => reload().catch((error) => showError(String(error.message))));
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      table.page.offset = 0;
      reload().catch((error) => showError(String(error.message)));
    });

    // -- the panel ------------------------------------------------------------------------
    // A line of the last SPARK_POINTS minutes, each point at its minute (a minute without
    // telemetry is a gap in the spacing, not a point drawn).
    function spark(points, max, label) {
      const width = 120, height = 24, step = width / (SPARK_POINTS - 1);
      const newest = minuteOf(new Date());
      const xy = points
        .filter((p) => newest - p.minute < SPARK_POINTS)
        .map((p) => {
          const x = width - (newest - p.minute) * step;
          const y = height - (Math.min(p.value, max) / (max || 1)) * (height - 2) - 1;
          return `${x.toFixed(1)},${y.toFixed(1)}`;
        });
      const ns = "http://www.w3.org/2000/svg";
      const svg = document.createElementNS(ns, "svg");
      svg.setAttribute("class", "spark");
      svg.setAttribute("width", width);
      svg.setAttribute("height", height);
      svg.setAttribute("data-samples", xy.length);
      svg.setAttribute("data-series", label);
      const line = document.createElementNS(ns, "polyline");
      line.setAttribute("points", xy.join(" "));
      svg.append(line);
      if (xy.length) {
        const [x, y] = xy[xy.length - 1].split(",");
        const dot = document.createElementNS(ns, "circle");
        dot.setAttribute("cx", x);
        dot.setAttribute("cy", y);
        dot.setAttribute("r", "2");
        svg.append(dot);
      }
      return svg;
    }
    const minuteOf = (date) => Math.floor(date.getTime() / 60000);
    // A live sample joins the current minute's point (a running mean), or starts the next.
    function sample(series, key, value) {
      if (value === null || value === undefined || Number.isNaN(value)) return;
      const list = series.get(key) || [];
      const minute = minuteOf(new Date());
      const last = list[list.length - 1];
      if (last && last.minute === minute) {
        last.value = (last.value * last.n + value) / (last.n + 1);
        last.n += 1;
      } else {
        list.push({ minute, value, n: 1 });
      }
      while (list.length > SPARK_POINTS) list.shift();
      series.set(key, list);
    }
    // The figures of one minute, from the rollup's point or from a telemetry sample: RAM
    // used (%), the GPUs' mean utilization (%), their memory used (GiB, summed), their
    // highest temperature (°C).
    function figures(point) {
      const ram = point.ram_total_bytes ? (100 * point.ram_used_bytes) / point.ram_total_bytes : null;
      const memory = point.gpu_memory_used_bytes;
      return [["ram", ram], ["gpu", point.gpu_utilization_percent],
        ["gpu-memory", memory === null || memory === undefined ? null : memory / GiB],
        ["temperature", point.gpu_temperature_max_c]];
    }
    // The rollup's minutes (the node's history route, NodeHistory); an answer that fails
    // leaves the lines to the live samples.
    async function history(id, series) {
      let body;
      try {
        body = await getJson(`${kit.paths.nodes}/${id}/history`, { range: "1h" });
      } catch (_) {
        return;
      }
      for (const point of (body.points || []).slice(-SPARK_POINTS)) {
        const minute = minuteOf(new Date(point.start));
        for (const [key, value] of figures(point)) {
          if (value === null || value === undefined) continue;
          const list = series.get(key) || [];
          list.push({ minute, value: Number(value), n: 1 });
          series.set(key, list);
        }
      }
    }
    function liveSample(series, telemetry) {
      const gpus = telemetry.gpus || [];
      const utils = gpus.map((g) => g.utilization_percent).filter((v) => v !== null && v !== undefined);
      const memory = gpus.map((g) => g.memory_used_bytes).filter((v) => v !== null && v !== undefined);
      const temps = gpus.map((g) => g.temperature_c).filter((v) => v !== null && v !== undefined);
      const point = {
        ram_total_bytes: telemetry.ram_total_bytes,
        ram_used_bytes: telemetry.ram_used_bytes,
        gpu_utilization_percent: utils.length ? utils.reduce((a, b) => a + b, 0) / utils.length : null,
        gpu_memory_used_bytes: memory.length ? memory.reduce((a, b) => a + b, 0) : null,
        gpu_temperature_max_c: temps.length ? Math.max(...temps) : null,
      };
      for (const [key, value] of figures(point)) sample(series, key, value);
    }
    function sparkRow(label, key, max, unit, digits) {
      const points = detail.series.get(key) || [];
      const last = points[points.length - 1];
      return [el("dt", {}, label), el("dd", { "data-role": `spark-${key}` }, spark(points, max, key),
        last ? ` ${last.value.toFixed(digits)}${unit}` : " —")];
    }

    const part = (role, title) => el("div", { "data-part": role }, el("h3", {}, title), el("div", { "data-role": "body" }));
    function fill(role, ...children) {
      if (!detail) return;
      const box = panel.querySelector(`[data-part="${role}"] [data-role="body"]`);
      if (box) box.replaceChildren(...children.filter((child) => child !== null && child !== undefined));
    }
    const muted = (text) => el("p", { class: "muted" }, text);
    const gib = (bytes) => (bytes === null || bytes === undefined ? "—" : `${(bytes / GiB).toFixed(1)}`);

    function drawNode(node) {
      const telemetry = node.telemetry;
      const byUuid = new Map((telemetry?.gpus || []).map((gpu) => [gpu.uuid, gpu]));
      const host = node.inventory?.host;
      panel.querySelector('[data-role="title"]').replaceChildren(
        `${node.display_name || node.hostname} `, badge(node.liveness));
      fill("facts", el("dl", { class: "facts" },
        el("dt", {}, "Node"), el("dd", { class: "mono select" }, node.id),
        el("dt", {}, "Labels"), el("dd", { class: "mono", "data-role": "labels" },
          Object.keys(node.labels).length ? labelsOf(node.labels) : "none"),
        el("dt", {}, "Agent"), el("dd", { "data-role": "agent" }, `${node.agent_version} (protocol ${node.protocol_version})`),
        el("dt", {}, "Last heartbeat"), el("dd", { "data-role": "heartbeat" }, ago(node.last_heartbeat_at)),
        el("dt", {}, "Enrolled"), el("dd", {}, ago(node.enrolled_at)),
        el("dt", {}, "Enabled"), el("dd", {}, node.enabled ? "yes" : "no"),
        el("dt", {}, "Host"), el("dd", {}, host ? [host.os, host.cpu_model, host.cpu_count ? `${host.cpu_count} CPUs` : ""].filter(Boolean).join(" · ") || "—" : "no inventory yet")));
      const gpuMemory = node.gpus.reduce((sum, gpu) => sum + gpu.memory_total_bytes, 0) / GiB;
      fill("history", el("dl", { class: "facts" },
        ...sparkRow("RAM used", "ram", 100, "%", 0),
        // GPU lines where the node has GPUs now, or had them in the last hour.
        ...(node.gpus.length || detail.series.has("gpu") ? [
          ...sparkRow("GPU utilization (mean)", "gpu", 100, "%", 0),
          ...sparkRow("GPU memory used", "gpu-memory", gpuMemory || 1, " GiB", 1),
          ...sparkRow("GPU temperature (max)", "temperature", 100, " °C", 0)] : [])));
      fill("gpus", node.gpus.length ? el("table", { class: "grid", id: "gpus" },
        el("thead", {}, el("tr", {}, ["GPU", "Name", "Memory (GiB)", "Utilization", "Temperature", "State"].map((h) => el("th", {}, h)))),
        el("tbody", {}, node.gpus.map((gpu) => {
          const now = byUuid.get(gpu.uuid) || {};
          return el("tr", { "data-gpu": gpu.uuid },
            el("td", {}, `#${gpu.index}`),
            el("td", {}, gpu.name),
            el("td", {}, `${gib(now.memory_used_bytes || 0)} / ${gib(gpu.memory_total_bytes)}`),
            el("td", {}, now.utilization_percent === undefined || now.utilization_percent === null ? "—" : `${now.utilization_percent}%`),
            el("td", {}, now.temperature_c === undefined || now.temperature_c === null ? "—" : `${now.temperature_c} °C`),
            el("td", {}, gpu.missing ? badge("missing") : "present"));
        }))) : muted("No GPUs reported."));
      const roots = host?.artifact_roots || [];
      fill("roots", roots.length ? el("ul", { class: "mono", "data-role": "roots" }, roots.map((root) => el("li", {}, root)))
        : muted("No artifact roots."));
    }
    function drawArtifacts(items) {
      fill("artifacts", items.length ? el("table", { class: "grid", id: "node-artifacts" },
        el("thead", {}, el("tr", {}, ["Repository", "Commit", "Root", "Files", "Size (GiB)", "Recorded"].map((h) => el("th", {}, h)))),
        el("tbody", {}, items.map((a) => el("tr", {},
          el("td", { class: "wrap" }, a.repository),
          el("td", { class: "mono", title: a.commit }, a.commit.slice(0, 12)),
          el("td", { class: "mono" }, a.root),
          el("td", {}, a.files.length),
          el("td", {}, gib(a.files.reduce((sum, f) => sum + f.size, 0))),
          el("td", {}, ago(a.recorded_at)))))) : muted("No artifacts."));
    }
    function drawRuntime(runtime) {
      if (!runtime.reported) {
        fill("runtime", muted("The runtime worker has not reported."));
        return;
      }
      fill("runtime", el("table", { class: "grid", id: "node-devices" },
        el("thead", {}, el("tr", {}, ["Device", "Backend", "Name", "Free / total (GiB)", "Utilization", "Loaded", "Queue"].map((h) => el("th", {}, h)))),
        el("tbody", {}, runtime.devices.map((d) => el("tr", { "data-device": d.device_id },
          el("td", { class: "mono" }, d.device_id),
          el("td", {}, d.backend),
          el("td", {}, d.name || "—"),
          el("td", {}, `${gib(d.memory_free_bytes)} / ${gib(d.memory_total_bytes)}`),
          el("td", {}, d.utilization_percent === null || d.utilization_percent === undefined ? "—" : `${d.utilization_percent}%`),
          el("td", {}, d.loaded_model || "—"),
          el("td", { "data-role": "queue" }, d.queue_depth))))),
        runtime.served_models.length ? el("p", {}, "Serves ", runtime.served_models.map((m) => m.model_id).join(", ")) : null);
    }
    function drawDeployments(items) {
      fill("deployments", items.length ? el("table", { class: "grid", id: "node-deployments" },
        el("thead", {}, el("tr", {}, ["Deployment", "Model", "Endpoints", "Tool calls", "Device", "State", "Queue", "Changed"].map((h) => el("th", {}, h)))),
        el("tbody", {}, items.map((d) => el("tr", { "data-deployment-id": d.id },
          el("td", { class: "mono" }, short(d.id)),
          el("td", {}, d.model),
          el("td", {}, kit.endpoints(d.endpoints)),
          el("td", {}, kit.toolCalls(d.capabilities)),
          el("td", { class: "mono" }, d.device_id),
          el("td", {}, badge(d.state), d.failure ? ` ${d.failure.code}` : ""),
          el("td", {}, d.queue_depth === null ? "—" : d.queue_depth),
          el("td", {}, ago(d.state_changed_at)))))) : muted("No deployments."));
    }

    // Each part is read by itself: an event about the node's jobs re-reads its artifacts,
    // one about its deployments those and the runtime, the poll the node and its runtime.
    const readers = {
      node: async (id) => {
        const node = await getJson(`${kit.paths.nodes}/${id}`);
        if (!detail || detail.id !== id) return;
        if (node.telemetry) liveSample(detail.series, node.telemetry);
        drawNode(node);
      },
      artifacts: async (id) => {
        const body = await getJson(`${kit.paths.nodes}/${id}/artifacts`);
        if (detail && detail.id === id) drawArtifacts(body.items);
      },
      runtime: async (id) => {
        const body = await getJson(`${kit.paths.nodes}/${id}/runtime`);
        if (detail && detail.id === id) drawRuntime(body);
      },
      deployments: async (id) => {
        const body = await getJson(kit.paths.deployments, { node_id: id, limit: DEPLOYMENTS_SHOWN });
        if (detail && detail.id === id) drawDeployments(body.items);
      },
    };
    const read = (what) => {
      if (!detail) return;
      const id = detail.id;
      coalesce(`node-panel:${what}:${id}`, () => readers[what](id));
    };

    async function openDetail(id) {
      closeDetail();
      detail = { id, series: new Map(), timer: null };
      const close = el("button", { type: "button", class: "close", "data-role": "close", "aria-label": "Close the node panel", title: "Close (Esc)" }, "×");
      close.addEventListener("click", closeDetail);
      panel.replaceChildren(
        el("div", { class: "panel-head" }, el("h2", { "data-role": "title" }, "…"), close),
        part("facts", "Node"), part("history", "The last hour"), part("gpus", "GPUs"), part("runtime", "Runtime worker: devices and queue"),
        part("deployments", "Deployments"), part("roots", "Artifact roots"), part("artifacts", "Artifacts"));
      panel.hidden = false;
      await history(id, detail.series);
      if (!detail || detail.id !== id) return;
      await Promise.all(Object.values(readers).map((reader) => reader(id)));
      if (detail && detail.id === id) {
        detail.timer = setInterval(() => { read("node"); read("runtime"); }, DETAIL_POLL_MS);
      }
    }
    function closeDetail() {
      if (detail && detail.timer) clearInterval(detail.timer);
      detail = null;
      panel.hidden = true;
      panel.replaceChildren();
    }
    document.addEventListener("keydown", (event) => {
      if (event.key === "Escape" && detail) closeDetail();
    });

    // The page on screen, read again and patched in place (no row replaced).
    async function repoll() {
      const items = await table.load(table.page.offset);
      for (const node of items) if (table.visible(node.id)) table.replace(node);
    }

    return {
      section,
      show: async () => {
        clearInterval(poll);
        poll = setInterval(() => repoll().catch(() => {}), PAGE_POLL_MS);
        await reload();
      },
      hide: () => {
        clearInterval(poll);
        closeDetail();
      },
      refresh: reload,
      onEvent(event) {
        if (section.hidden) return; // read again when shown
        const action = String(event.action);
        const id = event.nodeid;
        if (detail && id === detail.id) {
          if (action.startsWith("node.")) read("node");
          else if (action.startsWith("job.")) read("artifacts");
          else if (action.startsWith("deployment.")) { read("deployments"); read("runtime"); }
        }
        if (!id || !action.startsWith("node.")) return;
        if (table.visible(id)) {
          coalesce(`node:${id}`, async () => table.replace(await getJson(`${kit.paths.nodes}/${id}`)));
        } else {
          countUnseen();
        }
      },
    };
  };
})();
