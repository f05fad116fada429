// Wiring: the legend, the token form, the run list and its light poll, the shortcuts, and the
// run named in the URL's fragment.
"use strict";

function legend() {
  const shown = ["pending", "blocked", "awaiting_approval", "running", "done", "error", "rejected", "interrupted"];
  $("#legend").replaceChildren(...shown.map((s) => el("span", { class: "legend-item", "data-status": s },
    el("span", { class: "dot" }), statusLabel(s))));
}

async function cancelRun() {
  const id = page.selected;
  if (!id || !confirm("Cancel run " + id + "?")) return;
  try {
    await api("POST", "/runs/" + encodeURIComponent(id) + "/cancel", { reason: "cancelled from the reviewer page" });
    notice("Cancelling run " + id + ".", "ok");
  } catch (e) {
    notice("Cannot cancel: " + e.message, "error");
  }
  scheduleRefresh();
}

function start() {
  legend();
  setupRunList();
  setupKeys();
  $("#token-form").addEventListener("submit", tokenGiven);
  $("#cancel-run").addEventListener("click", cancelRun);
  loadRuns().then(() => {
    const wanted = decodeURIComponent(location.hash.slice(1));
    if (wanted) select(wanted);
  });
  // The list's page is polled lightly (one page of summaries, while the tab is visible); the
  // selected run follows its event stream, and only a stopped one (nobody drives it, so it has
  // no live stream) is looked at again on this tick.
  setInterval(() => {
    if (page.tokenWaiters || document.hidden) return; // waiting for the token form, or unseen
    loadRuns();
    if (!page.selected || !page.run) return;
    if (page.run.status === "stopped") {
      // Nobody drives it now: look again now and then (a server may continue it).
      refreshRun();
    } else if (!page.es && !page.reopenTimer && !finished(page.run)) {
      // A live run without a stream gets one back.
      openStream();
    }
  }, RUNS_EVERY_MS);
  window.addEventListener("hashchange", () => {
    const id = decodeURIComponent(location.hash.slice(1));
    if (id && id !== page.selected) select(id);
  });
}

start();
