// Wiring: the legend, the token form, the run list and its light poll, the shortcuts, and the
// run (and call) named in the URL: `#RUN`, or a notification's `?run=RUN&call=N`.
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

// A follow-up of the finished run in its session (docs/sessions.md): the run's goal with the
// instruction typed here, from its final state and history. A busy session is refused
// (`session.busy`), not waited for.
async function followUp(ev) {
  ev.preventDefault();
  const id = page.selected;
  const text = $("#follow-up-text").value.trim();
  if (!id || !text) return;
  try {
    const made = await api("POST", "/runs/" + encodeURIComponent(id) + "/continue", { text });
    $("#follow-up-text").value = "";
    notice("Follow-up " + made.id + " started.", "ok");
    await loadRuns();
    select(made.id);
  } catch (e) {
    notice("Cannot follow up: " + e.message, "error");
  }
}

function start() {
  legend();
  setupRunList();
  setupKeys();
  setupTabs();
  $("#next-waiting").addEventListener("click", nextWaiting);
  setInterval(tickDuration, 1000);
  $("#token-form").addEventListener("submit", tokenGiven);
  $("#cancel-run").addEventListener("click", cancelRun);
  $("#follow-up").addEventListener("submit", followUp);
  // A link names a run as `#RUN` or, from a notification, `?run=RUN&call=N` (the call's card
  // is focused once it is shown; `c2` and `2` both name call 2).
  const query = new URLSearchParams(location.search);
  const call = (query.get("call") || "").replace(/^c/, "");
  page.focusCall = /^[0-9]+$/.test(call) ? Number(call) : null;
  loadRuns().then(() => {
    const wanted = query.get("run") || decodeURIComponent(location.hash.slice(1));
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
