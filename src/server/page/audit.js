// The run's audit as a tab beside its calls: every decision, standing approval, revocation and
// cancellation (GET /runs/{id}/audit) with ISO times, who decided through which channel, the
// rule or standing approval it came from, and for an edit what changed (the params presented against the
// params that ran, from the run's calls).
"use strict";

function showTab(name) {
  for (const b of document.querySelectorAll("#tabs button")) {
    b.setAttribute("aria-selected", String(b.dataset.tab === name));
  }
  for (const p of document.querySelectorAll(".tab-panel")) p.hidden = p.dataset.tab !== name;
  page.tab = name;
  if (name === "audit") loadAudit();
  if (name === "fork") renderFork(page.run);
}

function isoTime(ms) {
  const d = new Date(ms);
  return isNaN(d.getTime()) ? String(ms) : d.toISOString();
}

// What an edit or a replacement changed: the params presented against the params that ran.
function auditDiff(entry) {
  const call = ((page.run && page.run.calls) || []).find((c) => c.id === entry.call_id);
  if (!call || !call.params || (entry.decision !== "edit" && entry.decision !== "replace")) return null;
  const presented = call.presented || call.proposed;
  return el("div", { class: "audit-diff" }, paramsDiff(editableParams(presented), editableParams(call.params)));
}

function auditRow(e) {
  const who = e.principal ? e.principal + (e.channel ? " (" + e.channel + ")" : "") : (e.timed_out ? "timeout" : "—");
  let what = e.what;
  if (e.what === "decision") what = e.decision + (e.timed_out ? " (timed out)" : "");
  // A standing approval's id is `standing` (`grant` in a run compacted before the rename).
  const standing = e.standing || e.grant;
  if (e.what === "allow" || e.what === "grant") what = "allow " + standing;
  if (e.what === "revoke") what = "revoke " + standing;
  if (e.what === "cancel") what = "cancel → " + e.status;
  const why = [e.rule ? "rule " + e.rule : null, standing && e.what === "decision" ? "standing " + standing : null,
    e.reason ? "“" + e.reason + "”" : null].filter(Boolean).join(" · ");
  return el("tr", { "data-what": e.what, "data-call-id": e.call_id },
    el("td", {}, el("time", { datetime: isoTime(e.at), text: isoTime(e.at) })),
    el("td", { text: e.call_id !== undefined && e.call_id !== null ? (e.tool || "?") + " #" + e.call_id : "" }),
    el("td", { class: "audit-what", text: what }),
    el("td", { text: who }),
    el("td", {}, why, auditDiff(e)));
}

async function loadAudit() {
  const id = page.selected;
  if (!id) return;
  let entries;
  try {
    entries = await api("GET", "/runs/" + encodeURIComponent(id) + "/audit");
  } catch (e) {
    if (id === page.selected) $("#audit").replaceChildren(el("p", { class: "form-error", text: "Cannot load the audit: " + e.message }));
    return;
  }
  if (id !== page.selected) return;
  const rows = (Array.isArray(entries) ? entries : []).map(auditRow);
  $("#audit").replaceChildren(rows.length
    ? el("table", { class: "audit" },
      el("thead", {}, el("tr", {}, ["time (UTC)", "call", "what", "by", "why / what changed"].map((h) => el("th", { text: h })))),
      el("tbody", {}, rows))
    : el("p", { class: "muted", text: "Nothing decided yet." }));
}

function setupTabs() {
  for (const b of document.querySelectorAll("#tabs button")) {
    b.addEventListener("click", () => showTab(b.dataset.tab));
  }
  showTab("calls");
}
