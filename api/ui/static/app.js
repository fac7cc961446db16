// The fleet dashboard: plain JavaScript over the admin JSON API (session cookie, no key)
// and its event stream. Why it is shaped this way:
// - Every list is one server-side page (limit/offset and the API's own filters): a fleet
//   of 10,000 nodes is never loaded whole.
// - An event refreshes only the row it names, when that row is on screen (one GET of
//   that one object, coalesced); events about rows off screen are counted, and the page
//   is re-read only when the operator asks, or once after the stream reconnects.
// - Nothing is written to localStorage; the session cookie is HttpOnly and the CSRF
//   token is read from its own cookie for the one request that changes something.
// - Text only ever goes in through textContent: no markup from the API is interpreted.
"use strict";

(() => {
  const PAGE = 50;
  const COALESCE_MS = 250;
  const JOB_POLL_MS = 5000;
  const TICK_MS = 1000;
  const ENDED_SHOWN = 10;

  let paths = null;
  let source = null;
  const pending = new Map(); // key -> timer: coalesced row refreshes
  const views = {};
  let current = null;

  // -- helpers ---------------------------------------------------------------------------
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name === "class") node.className = value;
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }
  const short = (id) => (id ? String(id).slice(0, 8) : "");
  const when = (iso) => (iso ? new Date(iso).toLocaleString() : "—");
  const badge = (text) => el("span", { class: `badge ${text}` }, text);
  // What a deployment or a service serves (schemas/endpoints.py), and whether its loaded
  // chat template calls tools, as its node reported (unknown before a load).
  const endpoints = (list) => el("span", { "data-role": "endpoints" }, (list || []).join(", ") || "—");
  const toolCalls = (caps) => el("span", { "data-role": "tool-calls" },
    !caps ? "unknown" : !caps.supports_tool_calls ? "no" : caps.supports_parallel_tool_calls ? "yes, in parallel" : "yes");

  // Relative times ("4 s ago"), the absolute one on hover: a <time> whose text one timer
  // (tick) rewrites in place, never the row or the table around it.
  function relative(iso, now) {
    const seconds = Math.round((now - new Date(iso).getTime()) / 1000);
    const span = Math.abs(seconds);
    let text;
    if (span < 60) text = `${span} s`;
    else if (span < 3600) text = `${Math.floor(span / 60)} min`;
    else if (span < 86400) text = `${Math.floor(span / 3600)} h`;
    else text = `${Math.floor(span / 86400)} d`;
    return seconds < 0 ? `in ${text}` : `${text} ago`;
  }
  function setAgo(node, iso) {
    if (!iso) {
      node.removeAttribute("datetime");
      node.removeAttribute("title");
      if (node.textContent !== "—") node.textContent = "—";
      return node;
    }
    if (node.getAttribute("datetime") !== iso) {
      node.setAttribute("datetime", iso);
      node.setAttribute("title", when(iso));
    }
    const text = relative(iso, Date.now());
    if (node.textContent !== text) node.textContent = text;
    return node;
  }
  const ago = (iso) => setAgo(el("time", { class: "ago" }), iso);
  function tick() {
    const now = Date.now();
    for (const node of document.querySelectorAll(".view:not([hidden]) time.ago[datetime]")) {
      const text = relative(node.getAttribute("datetime"), now);
      if (node.textContent !== text) node.textContent = text;
    }
  }

  function cookie(name) {
    for (const part of document.cookie.split(";")) {
      const [key, ...rest] = part.trim().split("=");
      if (key === name) return decodeURIComponent(rest.join("="));
    }
    return "";
  }

  function showError(message) {
    const box = document.getElementById("error");
    box.textContent = message;
    box.hidden = !message;
  }

  async function getJson(path, params) {
    const url = new URL(path, location.origin);
    for (const [key, value] of Object.entries(params || {})) {
      for (const item of [].concat(value)) {
        if (item !== "" && item !== null && item !== undefined) url.searchParams.append(key, item);
      }
    }
    const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (response.status === 401) {
      location.assign(paths ? paths.login : "/ui/login");
      throw new Error("signed out");
    }
    if (!response.ok) {
      let detail = `${response.status}`;
      try {
        // The admin API's error contract (schemas/errors.py: ErrorBody): code and message
        // at the top level, and for a validation failure which field and why.
        const body = await response.json();
        const code = typeof body?.code === "string" ? body.code : "";
        const message = typeof body?.message === "string" ? body.message : "";
        if (code || message) detail = `${response.status} ${code}: ${message}`;
        const field = Array.isArray(body?.details) ? body.details[0] : null;
        if (field && Array.isArray(field.location) && typeof field.message === "string") {
          detail += ` (${field.location.join(".")}: ${field.message})`;
        }
      } catch (_) { /* not JSON */ }
      throw new Error(detail);
    }
    return response.json();
  }

  function coalesce(key, work) {
    if (pending.has(key)) return;
    pending.set(key, setTimeout(() => {
      pending.delete(key);
      work().catch((error) => showError(String(error.message || error)));
    }, COALESCE_MS));
  }

  function flash(row) {
    row.classList.remove("flash");
    void row.offsetWidth; // restart the animation
    row.classList.add("flash");
  }

  // -- a paged table, shared by the views -------------------------------------------------
  // load(offset) -> items; rowOf(item) -> <tr>; keyOf(item) -> id; patch(row, item) ->
  // changed, where given, updates a row in place instead of replacing it.
  function pagedTable({ section, table, load, rowOf, keyOf, patch }) {
    const body = document.querySelector(`#${table} tbody`);
    const range = section.querySelector('[data-role="range"]');
    const prev = section.querySelector('[data-page="prev"]');
    const next = section.querySelector('[data-page="next"]');
    const page = { offset: 0, rows: new Map(), more: false };

    async function reload() {
      const items = await load(page.offset);
      page.more = items.length > PAGE;
      const shown = items.slice(0, PAGE);
      page.rows = new Map();
      body.replaceChildren(...shown.map((item) => {
        const row = rowOf(item);
        page.rows.set(String(keyOf(item)), row);
        return row;
      }));
      if (range) range.textContent = shown.length ? `${page.offset + 1}–${page.offset + shown.length}` : "none";
      if (prev) prev.disabled = page.offset === 0;
      if (next) next.disabled = !page.more;
    }
    function replace(item) {
      const key = String(keyOf(item));
      const old = page.rows.get(key);
      if (!old) return;
      if (patch) {
        if (patch(old, item)) flash(old);
        return;
      }
      const row = rowOf(item);
      old.replaceWith(row);
      page.rows.set(key, row);
      flash(row);
    }
    // A new item at the top of the first page (lists are newest first), the rows on
    // screen kept as they are; the page's last row leaves when the page is full.
    function prepend(item) {
      const key = String(keyOf(item));
      if (page.offset !== 0 || page.rows.has(key)) return;
      const row = rowOf(item);
      body.prepend(row);
      page.rows.set(key, row);
      flash(row);
      while (page.rows.size > PAGE) {
        const last = body.lastElementChild;
        for (const [shown, element] of page.rows) if (element === last) page.rows.delete(shown);
        last.remove();
        page.more = true;
        if (next) next.disabled = false;
      }
      if (range) range.textContent = `${page.offset + 1}–${page.offset + page.rows.size}`;
    }
    function remove(key) {
      const old = page.rows.get(String(key));
      if (old) old.remove();
      page.rows.delete(String(key));
    }
    if (prev) prev.addEventListener("click", () => { page.offset = Math.max(0, page.offset - PAGE); reload(); });
    if (next) next.addEventListener("click", () => { page.offset += PAGE; reload(); });
    return { page, load, reload, replace, prepend, remove, visible: (key) => page.rows.has(String(key)) };
  }

  // -- jobs -------------------------------------------------------------------------------
  function progressOf(job) {
    const progress = job.progress;
    if (!progress) return job.state === "succeeded" ? "done" : "—";
    if ("bytes_total" in progress) {
      const ratio = progress.bytes_total ? progress.bytes_done / progress.bytes_total : 0;
      const percent = Math.floor(100 * ratio);
      return el("span", { "data-role": "progress", "data-percent": percent },
        el("span", { class: "bar" }, el("span", { style: null, "data-width": percent })),
        `${percent}% (${progress.files_done}/${progress.files_total} files)`);
    }
    return progress.phase || "—";
  }

  function jobsView() {
    const section = document.getElementById("view-jobs");
    const form = document.getElementById("job-filter");
    const base = () => (new FormData(form).get("kind") === "deployment" ? paths.deployment_jobs : paths.artifact_jobs);
    let poll = null;

    const table = pagedTable({
      section,
      table: "jobs",
      keyOf: (job) => job.id,
      load: async (offset) => {
        const filter = new FormData(form);
        return (await getJson(base(), { limit: PAGE + 1, offset, state: filter.get("state") })).items;
      },
      rowOf: (job) => {
        const row = el("tr", { "data-job-id": job.id },
          el("td", { class: "mono" }, short(job.id)),
          el("td", {}, job.kind),
          el("td", { class: "mono" }, short(job.node_id)),
          el("td", {}, badge(job.state)),
          el("td", {}, `${job.attempt}/${job.max_attempts}`),
          el("td", {}, progressOf(job)),
          el("td", {}, ago(job.updated_at)));
        // The bar's width through the CSSOM: an inline style attribute is refused by the CSP.
        for (const bar of row.querySelectorAll("[data-width]")) bar.style.width = `${bar.dataset.width}%`;
        return row;
      },
    });
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      table.page.offset = 0;
      table.reload().catch((error) => showError(String(error.message)));
    });
    const refreshJob = (id) => coalesce(`job:${id}`, async () => table.replace(await getJson(`${base()}/${id}`)));

    return {
      section,
      show: () => {
        // Progress events mark quarters only; the leased jobs on screen are re-read in
        // between, a handful of single-row GETs, never the list.
        poll = setInterval(() => {
          for (const [id, row] of table.page.rows) {
            if (row.querySelector(".badge.leased")) refreshJob(id);
          }
        }, JOB_POLL_MS);
        return table.reload();
      },
      hide: () => clearInterval(poll),
      refresh: () => table.reload(),
      onEvent(event) {
        // A hidden tab reads its page again when shown: nothing to do for it meanwhile.
        if (section.hidden || !String(event.action).startsWith("job.")) return;
        const id = event.data?.job_id || event.targetid;
        if (table.visible(id)) refreshJob(id);
        else if (event.action === "job.created" && table.page.offset === 0) coalesce("jobs:page", table.reload);
      },
    };
  }

  // -- deployments ------------------------------------------------------------------------
  function deploymentsView() {
    const section = document.getElementById("view-deployments");
    const form = document.getElementById("deployment-filter");
    const table = pagedTable({
      section,
      table: "deployments",
      keyOf: (d) => d.id,
      load: async (offset) => {
        const state = new FormData(form).get("state");
        return (await getJson(paths.deployments, { limit: PAGE + 1, offset, state })).items;
      },
      rowOf: (d) => el("tr", { "data-deployment-id": d.id },
        el("td", { class: "mono" }, short(d.id)),
        el("td", {}, d.model, d.roles.length ? ` (${d.roles.join(", ")})` : ""),
        el("td", {}, endpoints(d.endpoints)),
        el("td", {}, toolCalls(d.capabilities)),
        el("td", { class: "mono" }, `${short(d.node_id)} / ${d.device_id}`),
        el("td", {}, badge(d.state), d.failure ? ` ${d.failure.code}` : ""),
        el("td", {}, d.queue_depth === null ? "—" : d.queue_depth),
        el("td", {}, d.max_concurrent),
        el("td", {}, d.cooldown_until ? `until ${when(d.cooldown_until)} ${d.cooldown_reason || ""}` : "—"),
        el("td", {}, ago(d.state_changed_at))),
    });
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      table.page.offset = 0;
      table.reload().catch((error) => showError(String(error.message)));
    });
    return {
      section,
      show: () => table.reload(),
      hide: () => {},
      refresh: () => table.reload(),
      onEvent(event) {
        if (section.hidden || !String(event.action).startsWith("deployment.")) return;
        const id = event.data?.deployment_id || event.targetid;
        if (table.visible(id)) coalesce(`deployment:${id}`, async () => table.replace(await getJson(`${paths.deployments}/${id}`)));
        else if (event.action === "deployment.created" && table.page.offset === 0) coalesce("deployments:page", table.reload);
      },
    };
  }

  // -- services ---------------------------------------------------------------------------
  // A service's row and its open panel come from one GET of that service (ServiceDetail:
  // the service and its live replicas), coalesced per service: a service.* event re-reads
  // only the service it names, and an unplaceable service that is retried every sweep
  // costs one GET per coalescing window, not one per event.
  // schemas/services.py: PlacementReason, in its order: the scheduler's order for equal
  // counts (store/services/placement.py: ORDER).
  const REASONS = ["offline", "disabled", "selector", "no_runtime", "environment", "device_kind",
    "device_busy", "insufficient_memory", "spread", "backoff", "no_root"];
  const rank = (reason) => (REASONS.includes(reason) ? REASONS.indexOf(reason) : REASONS.length);
  const gib = (bytes) => (bytes === null || bytes === undefined ? "unknown" : `${(bytes / 2 ** 30).toFixed(1)} GiB`);

  // "0 of 10 nodes: 7 selector, 2 insufficient memory (needs 9.1 GiB, best 7.8 GiB), 1 offline"
  function receiptCounts(receipt) {
    const parts = Object.entries(receipt.rejected || {})
      .filter(([, count]) => count > 0)
      .sort((a, b) => b[1] - a[1] || rank(a[0]) - rank(b[0]))
      .map(([reason, count]) => {
        let text = `${count} ${reason.replaceAll("_", " ")}`;
        if (reason === "insufficient_memory") text += ` (needs ${gib(receipt.needs_bytes)}, best ${gib(receipt.best_free_bytes)})`;
        return text;
      });
    const counted = `${receipt.feasible} of ${receipt.nodes_considered} nodes`;
    return parts.length ? `${counted}: ${parts.join(", ")}` : counted;
  }

  function rolloutOf(rollout) {
    return el("span", { "data-role": "rollout" }, badge(rollout.state),
      ` ${rollout.updated_ready}/${rollout.desired}`,
      rollout.outdated ? ` · ${rollout.outdated} outdated` : "");
  }

  function servicesView() {
    const section = document.getElementById("view-services");
    const detailBox = document.getElementById("service-detail");
    const form = document.getElementById("service-filter");
    const hostnames = new Map(); // node id -> display name, for the panel's replicas
    let detail = null; // { id }: the open panel's service
    const fresh = new Set(); // services created since the page was read

    const table = pagedTable({
      section,
      table: "services",
      keyOf: (service) => service.id,
      load: async (offset) => {
        const state = new FormData(form).get("state");
        return (await getJson(paths.services, { limit: PAGE + 1, offset, state })).items;
      },
      rowOf: (service) => {
        const receipt = service.last_receipt;
        const row = el("tr", { "data-service-id": service.id },
          el("td", { "data-role": "name" }, service.name),
          el("td", {}, endpoints(service.template.endpoints)),
          el("td", {}, badge(service.state)),
          el("td", { "data-role": "replicas" }, `${service.ready_replicas}/${service.replicas}`),
          el("td", {}, service.generation),
          el("td", {}, rolloutOf(service.rollout)),
          el("td", { class: "wrap", "data-role": "receipt" },
            receipt ? [badge(receipt.outcome), " ", receipt.message] : "—"));
        row.addEventListener("click", () => openDetail(service.id));
        return row;
      },
    });

    // A node's name is read once per panel's life (a node that cannot be read shows its
    // id only, and is not asked again).
    async function hostname(id) {
      if (!hostnames.has(id)) {
        try {
          const node = await getJson(`${paths.nodes}/${id}`);
          hostnames.set(id, node.display_name || node.hostname);
        } catch (_) {
          hostnames.set(id, "");
        }
      }
      return hostnames.get(id);
    }

    function receiptBlock(receipt) {
      if (!receipt) return [el("p", { class: "muted", "data-role": "last-receipt" }, "No placement decided yet.")];
      return [el("div", { "data-role": "last-receipt" },
        el("p", {}, badge(receipt.outcome), " ", ago(receipt.decided_at),
          receipt.node_id ? ` → ${short(receipt.node_id)} / ${receipt.device_id || ""}` : ""),
        el("p", { "data-role": "receipt-counts" }, receiptCounts(receipt)),
        el("p", { class: "mono", "data-role": "receipt-message" }, receipt.message))];
    }

    function replicaTable(id, replicas, service, names, empty) {
      return el("table", { class: "grid", id },
        el("thead", {}, el("tr", {}, ["Replica", "Node", "Device", "Phase", "Generation", "Placement", "Failure"]
          .map((h) => el("th", {}, h)))),
        el("tbody", {}, replicas.length ? replicas.map((replica) => el("tr", { "data-replica-id": replica.id },
          el("td", { class: "mono" }, short(replica.id)),
          el("td", { "data-role": "node" }, names.get(replica.node_id) ? `${names.get(replica.node_id)} ` : "",
            el("span", { class: "mono muted" }, short(replica.node_id))),
          el("td", { class: "mono" }, replica.device_id),
          el("td", { "data-role": "phase" }, badge(replica.phase), replica.ended_reason ? ` ${replica.ended_reason}` : ""),
          el("td", {}, replica.generation, replica.generation < service.generation ? " (outdated)" : ""),
          el("td", { class: "wrap", "data-role": "replica-receipt" }, replica.receipt ? replica.receipt.message : "—"),
          el("td", { class: "wrap", "data-role": "failure" },
            replica.failure ? `${replica.failure.code}${replica.failure.detail ? `: ${replica.failure.detail}` : ""}` : "—")))
          : [el("tr", {}, el("td", { colspan: 7, class: "muted" }, empty))]));
    }

    async function drawDetail(service) {
      // The answer holds the ended replicas too (?ended): the newest few are shown, for
      // why they ended (a failed load's code and detail).
      const live = service.items.filter((replica) => replica.phase !== "ended");
      const ended = service.items.filter((replica) => replica.phase === "ended")
        .sort((a, b) => String(b.phase_changed_at).localeCompare(String(a.phase_changed_at)))
        .slice(0, ENDED_SHOWN);
      const names = new Map();
      for (const replica of [...live, ...ended]) names.set(replica.node_id, await hostname(replica.node_id));
      if (!detail || detail.id !== service.id) return;
      const rollout = service.rollout;
      const percent = rollout.desired ? Math.floor((100 * rollout.updated_ready) / rollout.desired) : 100;
      detailBox.replaceChildren(
        el("h2", {}, `${service.name} `, badge(service.state)),
        el("p", { class: "mono" }, service.id),
        el("p", {}, "Serves ", endpoints(service.template.endpoints)),
        el("p", {}, `${service.ready_replicas} of ${service.replicas} replicas ready · generation ${service.generation}`,
          service.autoscale ? ` · autoscale ${service.autoscale.min_replicas}–${service.autoscale.max_replicas}` : ""),
        el("h3", {}, "Rollout"),
        el("p", { "data-role": "rollout-progress", "data-percent": percent },
          badge(rollout.state),
          " ", el("span", { class: "bar" }, el("span", { "data-width": percent })),
          `${rollout.updated_ready}/${rollout.desired} updated and ready · ${rollout.outdated} outdated`,
          rollout.reason ? ` · ${rollout.reason}` : ""),
        el("h3", {}, "Last placement"),
        ...receiptBlock(service.last_receipt),
        el("h3", {}, "Replicas"),
        replicaTable("replicas", live, service, names, "No live replicas."),
        el("h3", {}, `Ended, the last ${ENDED_SHOWN}`),
        replicaTable("ended-replicas", ended, service, names, "None ended."));
      // The bar's width through the CSSOM: an inline style attribute is refused by the CSP.
      for (const bar of detailBox.querySelectorAll("[data-width]")) bar.style.width = `${bar.dataset.width}%`;
      detailBox.hidden = false;
    }

    // One GET of the service: its row (when on screen) and its panel (when open).
    async function refresh(id) {
      let service;
      try {
        // The open panel's service with its ended replicas; a row needs only the service.
        const panel = detail && detail.id === id;
        service = await getJson(`${paths.services}/${id}`, panel ? { ended: "true", ended_limit: String(ENDED_SHOWN) } : {});
      } catch (error) {
        if (String(error.message).startsWith("404")) {
          table.remove(id);
          if (detail && detail.id === id) closeDetail();
          return;
        }
        throw error;
      }
      if (table.visible(id)) table.replace(service);
      else if (fresh.has(id) && [service.state, ""].includes(new FormData(form).get("state"))) table.prepend(service);
      if (detail && detail.id === id) await drawDetail(service);
    }
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      table.page.offset = 0;
      reload().catch((error) => showError(String(error.message)));
    });

    // The page read again holds every service created before it was read.
    async function reload() {
      fresh.clear();
      await table.reload();
    }

    // The panel is drawn again on its service's events only (a replica's every phase
    // change is one), never on a timer: what it shows is what the stream said.
    function openDetail(id) {
      detail = { id };
      refresh(id).catch((error) => showError(String(error.message)));
    }
    function closeDetail() {
      detail = null;
      detailBox.hidden = true;
    }

    return {
      section,
      show: reload,
      hide: closeDetail,
      // After the stream reconnects: the page and the open panel, read once.
      refresh: async () => {
        await reload();
        if (detail) await refresh(detail.id);
      },
      onEvent(event) {
        if (section.hidden || !String(event.action).startsWith("service.")) return;
        const id = event.data?.service_id || event.targetid;
        // A new service's row goes on top of the first page, the rows on screen are not
        // drawn again; its later events (one may come while its first GET is in flight)
        // re-read it as any row's.
        if (event.action === "service.created") fresh.add(id);
        if (table.visible(id) || fresh.has(id) || (detail && detail.id === id)) {
          coalesce(`service:${id}`, () => refresh(id));
        }
      },
    };
  }

  // -- incidents --------------------------------------------------------------------------
  function incidentsView() {
    const section = document.getElementById("view-incidents");
    const body = document.querySelector("#incidents tbody");
    async function reload() {
      const items = (await getJson(paths.incidents, { limit: 100 })).items;
      body.replaceChildren(...(items.length ? items.map((i) => el("tr", { "data-incident-id": i.id },
        el("td", { class: "mono" }, short(i.id)),
        el("td", {}, i.kind),
        el("td", {}, ago(i.opened_at)),
        el("td", {}, i.watched_nodes),
        el("td", {}, i.silent_nodes),
        el("td", {}, i.acknowledged_at ? `${when(i.acknowledged_at)}: ${i.acknowledged_reason || ""}` : "—"),
        el("td", {}, ago(i.resolved_at)))) : [el("tr", {}, el("td", { colspan: 7, class: "muted" }, "No incidents."))]));
    }
    return {
      section, show: reload, hide: () => {}, refresh: reload,
      onEvent(event) { if (!section.hidden && String(event.action).startsWith("fleet.")) coalesce("incidents", reload); },
    };
  }

  // -- the event stream -------------------------------------------------------------------
  function connect() {
    const live = document.getElementById("live");
    let broken = false;
    source = new EventSource(paths.events, { withCredentials: true });
    source.addEventListener("open", () => {
      live.textContent = "live";
      live.className = "live on";
      // Whatever happened while it was down is read once, not replayed.
      if (broken && current) current.refresh();
      broken = false;
    });
    source.addEventListener("error", async () => {
      live.textContent = "reconnecting";
      live.className = "live off";
      broken = true;
      if (source.readyState === EventSource.CLOSED) {
        // Refused (a 401 after logout or expiry), not a dropped connection: check.
        try { await getJson(paths.nodes, { limit: 1 }); setTimeout(connect, 2000); } catch (_) { /* redirected */ }
      }
    });
    const deliver = (message) => {
      let event;
      try { event = JSON.parse(message.data); } catch (_) { return; }
      for (const view of Object.values(views)) view.onEvent(event);
    };
    for (const type of paths.event_types) source.addEventListener(type, deliver);
    source.addEventListener(paths.overflow_event, () => {
      // Dropped for falling behind: start again and read the page once.
      source.close();
      broken = true;
      setTimeout(connect, 1000);
    });
  }

  // -- navigation -------------------------------------------------------------------------
  const landing = () => (views.overview ? "overview" : "nodes");
  function show(name) {
    if (!views[name]) name = landing();
    const view = views[name];
    if (current && current !== view) current.hide();
    for (const v of Object.values(views)) v.section.hidden = v !== view;
    for (const link of document.querySelectorAll("#tabs a")) {
      link.classList.toggle("active", link.dataset.view === name);
    }
    current = view;
    showError("");
    view.show().catch((error) => showError(String(error.message || error)));
  }

  async function logout() {
    if (source) source.close();
    await fetch(paths.logout, {
      method: "POST", credentials: "same-origin", headers: { [paths.csrf_header]: cookie(paths.csrf_cookie) },
    });
    location.assign(paths.login);
  }

  // What a view in its own file (overview.js, loaded before this one) is given: the
  // helpers, and the paths once they are read. Such a file registers a factory in
  // window.ModelForgeViews[name]; its tab and section are in index.html.
  const kit = {
    el, short, when, ago, setAgo, badge, endpoints, toolCalls, getJson, coalesce, flash, showError, pagedTable, PAGE,
    get paths() { return paths; },
  };

  async function start() {
    paths = await getJson("/ui/paths.json");
    for (const [name, make] of Object.entries(window.ModelForgeViews || {})) views[name] = make(kit);
    views.jobs = jobsView();
    views.deployments = deploymentsView();
    views.services = servicesView();
    views.incidents = incidentsView();
    document.getElementById("logout").addEventListener("click", logout);
    window.addEventListener("hashchange", () => show(location.hash.slice(1)));
    connect();
    setInterval(tick, TICK_MS);
    show(location.hash.slice(1) || landing());
  }

  document.addEventListener("DOMContentLoaded", () => { start().catch((error) => showError(String(error.message || error))); });
})();
