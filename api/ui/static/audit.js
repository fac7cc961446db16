// The Audit tab, registered for app.js as overview.js is: one server-side page of the
// audit log at a time (keyset: the API's next_before_id), filtered by the API (kind,
// node, actor, time; the periodic health checks left out unless asked for), and the
// stream's events on top of the first page as they arrive, when they pass the same
// filters. The correlation id is shown whole, to be selected and searched for.
"use strict";

(() => {
  const PAGE = 50;

  window.ModelForgeViews = window.ModelForgeViews || {};
  window.ModelForgeViews.audit = (kit) => {
    const { el, short, ago, flash, getJson, showError } = kit;
    const section = document.getElementById("view-audit");
    const form = document.getElementById("audit-filter");
    const body = document.querySelector("#audit tbody");
    const range = form.querySelector('[data-role="range"]');
    const prev = form.querySelector('[data-page="prev"]');
    const next = form.querySelector('[data-page="next"]');
    // before: this page's before_id (null: the newest); back: the pages before it.
    // restart: rows from the stream were pushed off the first page (they have no id to
    // page from), so Next reads the log again from the newest.
    const page = { before: null, back: [], next: null, shown: 0, restart: false };

    const row = (r) => el("tr", { "data-audit-action": r.action, "data-audit-id": r.id },
      el("td", {}, ago(r.at)),
      el("td", { class: "mono" }, r.actor),
      el("td", {}, r.action),
      el("td", { class: "mono", title: r.target_id }, `${r.target_type} ${short(r.target_id)}`),
      el("td", { class: "mono select", "data-role": "correlation" }, r.correlation_id || "—"));

    // datetime-local is the browser's local time; the API wants an instant.
    const instant = (value) => (value ? new Date(value).toISOString() : "");
    function filters() {
      const data = new FormData(form);
      return {
        kind: data.get("kind"),
        node_id: String(data.get("node_id") || "").trim(),
        actor: String(data.get("actor") || "").trim(),
        since: instant(data.get("since")),
        until: instant(data.get("until")),
        health_checks: data.get("health_checks") ? "true" : "",
      };
    }

    async function reload() {
      const answer = await getJson(kit.paths.audit, { ...filters(), limit: PAGE, before_id: page.before });
      body.replaceChildren(...(answer.items.length ? answer.items.map(row)
        : [el("tr", {}, el("td", { colspan: 5, class: "muted" }, "No audit rows match."))]));
      page.next = answer.next_before_id;
      page.shown = answer.items.length;
      page.restart = false;
      const first = PAGE * page.back.length;
      range.textContent = page.shown ? `${first + 1}–${first + page.shown}` : "none";
      prev.disabled = page.back.length === 0;
      next.disabled = page.next === null;
    }
    function fromStart() {
      page.before = null;
      page.back = [];
      return reload();
    }
    const failed = (error) => showError(String(error.message || error));
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      fromStart().catch(failed);
    });
    form.querySelector('[name="health_checks"]').addEventListener("change", () => fromStart().catch(failed));
    prev.addEventListener("click", () => {
      page.before = page.back.pop() ?? null;
      reload().catch(failed);
    });
    next.addEventListener("click", () => {
      if (page.restart) {
        fromStart().catch(failed);
        return;
      }
      if (page.next === null) return;
      page.back.push(page.before);
      page.before = page.next;
      reload().catch(failed);
    });

    // What the API would have returned for this event, by the same filters.
    function admits(event) {
      const action = String(event.action);
      if (kit.paths.not_audited.includes(action)) return false;
      const f = filters();
      const family = action.split(".")[0];
      if (!f.health_checks && family === "job" && kit.paths.audit_health_check_kinds.includes(event.data?.kind)) return false;
      if (f.kind && family !== f.kind) return false;
      if (f.actor && event.actor !== f.actor) return false;
      if (f.node_id && event.nodeid !== f.node_id && event.data?.node_id !== f.node_id) return false;
      if (f.since && event.time < f.since) return false;
      if (f.until) return false; // a fixed window: nothing new belongs in it
      return true;
    }

    return {
      section,
      show: fromStart,
      hide: () => {},
      refresh: fromStart,
      onEvent(event) {
        if (section.hidden || page.before !== null || !admits(event)) return;
        if (page.shown === 0) body.replaceChildren();
        const added = row({
          at: event.time, actor: event.actor, action: event.action, target_type: event.targettype,
          target_id: event.targetid, correlation_id: event.correlationid,
        });
        body.prepend(added);
        flash(added);
        page.shown += 1;
        while (body.rows.length > PAGE) {
          // The next page starts at the row pushed off this one (before_id is exclusive).
          const gone = body.lastElementChild.dataset.auditId;
          if (gone) page.next = Number(gone) + 1;
          else page.restart = true;
          body.lastElementChild.remove();
          page.shown = PAGE;
          next.disabled = false;
        }
        range.textContent = `1–${page.shown}`;
      },
    };
  };
})();
