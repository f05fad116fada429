// The run's calls, grouped by step, a nested agent's calls inside the delegate call that runs
// them; and the timeline (Gantt) with the critical path.
"use strict";

function renderCalls(run) {
  const box = $("#calls");
  const calls = run.calls || [];
  if (!calls.length) {
    box.replaceChildren(el("p", { class: "muted", text: "No calls yet." }));
    return;
  }
  // Calls arrive in id order and a delegate call before the calls of its nested agent.
  const cards = new Map();
  const byStep = new Map();
  for (const c of [...calls].sort((a, b) => a.id - b.id)) {
    const card = callCard(c);
    cards.set(c.id, card);
    const parent = c.parent !== undefined && c.parent !== null ? cards.get(c.parent) : null;
    if (parent) {
      let inner = parent.querySelector(":scope > .nested-calls");
      if (!inner) {
        inner = el("div", { class: "nested-calls" },
          el("div", { class: "nested-title muted small", text: "its agent's calls" }));
        parent.append(inner);
      }
      inner.append(card);
      continue;
    }
    if (!byStep.has(c.step)) byStep.set(c.step, []);
    byStep.get(c.step).push(card);
  }
  const cols = [];
  for (const step of Array.from(byStep.keys()).sort((a, b) => a - b)) {
    cols.push(el("div", { class: "step" },
      el("div", { class: "step-title", text: "step " + step }),
      el("div", { class: "step-calls" }, byStep.get(step))));
  }
  box.replaceChildren(...cols);
}

function paramsLine(params) {
  if (!params) return "";
  const parts = [];
  for (const [k, v] of Object.entries(params)) {
    if (k.startsWith("_") && k !== "_outputPath") continue;
    let s = typeof v === "string" ? v : JSON.stringify(v);
    if (s.length > 60) s = s.slice(0, 57) + "…";
    parts.push(k + ": " + s);
  }
  return parts.join(", ");
}

function callCard(c) {
  const status = c.interrupted && c.status === "awaiting_approval" ? "awaiting_approval" : c.status;
  const card = el("div", {
    class: "call", "data-call-id": c.id, "data-status": status,
    "data-parent": c.parent,
    title: pretty(c.params || {}),
  },
  el("div", { class: "call-head" },
    el("span", { class: "dot" }),
    el("strong", { text: c.tool || "?" }),
    el("span", { class: "muted", text: "#" + c.id }),
    el("span", { class: "status", text: statusLabel(status) + (c.interrupted ? " (interrupted)" : "") })),
  el("div", { class: "call-params", text: paramsLine(c.params) }));
  if (c.waiting_on && c.waiting_on.length) {
    card.append(el("div", { class: "waits" }, "waits on ",
      ...c.waiting_on.flatMap((w, i) => [i ? ", " : "", el("code", { text: String(w) })])));
  }
  const times = [];
  if (c.decision) {
    times.push(c.decision + (c.decision_timed_out ? " (timed out)" : "") +
      (c.decided_by ? " by " + c.decided_by.principal + " (" + c.decided_by.channel + ")" : "") +
      (c.decided_by_standing || c.decided_by_grant
        ? " through standing approval " + (c.decided_by_standing || c.decided_by_grant) : ""));
  }
  if (c.started_ms !== undefined && c.ended_ms !== undefined) times.push("ran " + fmtMs(c.ended_ms - c.started_ms));
  if (times.length) card.append(el("div", { class: "call-meta muted", text: times.join(" · ") }));
  // Against the params as presented (references resolved to their values), else as proposed.
  if ((c.decision === "edit" || c.decision === "replace") && (c.presented || c.proposed) && c.params) {
    card.append(el("details", { class: "call-diff" },
      el("summary", { class: "small", text: (c.presented ? "what was presented" : "what the model proposed") + " → what ran" }),
      paramsDiff(c.presented || c.proposed, c.params)));
  }
  if (c.error) {
    const msg = typeof c.error === "string" ? c.error : (c.error.error || c.error.message || JSON.stringify(c.error));
    card.append(el("div", { class: "call-error", text: msg }));
  }
  return card;
}

// ---------------------------------------------------------------- timeline (Gantt)

function spanKey(s) {
  return [s.what, s.call_id === undefined ? "" : s.call_id, s.start_ms, s.end_ms].join("|");
}

function renderGantt(run) {
  const box = $("#gantt");
  const spans = run.spans || [];
  const calls = run.calls || [];
  const critical = new Set((run.critical_path || []).map(spanKey));
  let total = run.duration_ms || 0;
  for (const s of spans) total = Math.max(total, s.end_ms);
  for (const c of calls) {
    for (const k of ["received_ms", "asked_ms", "decided_ms", "started_ms", "ended_ms"]) {
      if (c[k] !== undefined) total = Math.max(total, c[k]);
    }
  }
  if (!spans.length && !calls.length) {
    box.replaceChildren(el("p", { class: "muted", text: "Nothing has happened yet." }));
    return;
  }
  total = Math.max(total, 1);
  const pct = (ms) => (100 * ms / total).toFixed(3) + "%";
  const bar = (cls, start, end, label, crit, callId) => el("div", {
    class: "span " + cls + (crit ? " critical" : ""),
    "data-call-id": callId,
    style: "left:" + pct(start) + ";width:calc(" + pct(Math.max(end - start, 0)) + " + 2px)",
    title: label + ": " + fmtMs(start) + " → " + fmtMs(end) + " (" + fmtMs(end - start) + ")" + (crit ? " · critical path" : ""),
  });

  // One row per model step, then one per call: waiting (received → asked or started),
  // reviewer (asked → decided), running (started → ended).
  const rows = [];
  const modelSpans = spans.filter((s) => s.call_id === undefined || s.call_id === null);
  for (const s of modelSpans) {
    rows.push({ start: s.start_ms, label: s.what, kind: "model",
      bars: [bar("model", s.start_ms, s.end_ms, s.what, critical.has(spanKey(s)))] });
  }
  for (const c of calls) {
    const bars = [];
    const mine = spans.filter((s) => s.call_id === c.id);
    const first = c.received_ms !== undefined ? c.received_ms : (mine[0] ? mine[0].start_ms : 0);
    const waitEnd = c.asked_ms !== undefined ? c.asked_ms : c.started_ms;
    if (c.received_ms !== undefined && waitEnd !== undefined && waitEnd > c.received_ms) {
      bars.push(bar("wait", c.received_ms, waitEnd, "waiting for its inputs", false, c.id));
    }
    for (const s of mine) {
      const cls = s.what === "reviewer" ? "reviewer" : "run";
      bars.push(bar(cls, s.start_ms, s.end_ms, s.what === "reviewer" ? "reviewer" : "running", critical.has(spanKey(s)), c.id));
    }
    // Still open: the reviewer is thinking or the call is running.
    if (c.status === "awaiting_approval" && c.asked_ms !== undefined) {
      bars.push(bar("reviewer open", c.asked_ms, total, "reviewer (deciding)", false, c.id));
    } else if (c.status === "running" && c.started_ms !== undefined) {
      bars.push(bar("run open", c.started_ms, total, "running", false, c.id));
    }
    if (c.received_ms !== undefined) {
      bars.push(el("div", { class: "mark", style: "left:" + pct(c.received_ms), title: "received at " + fmtMs(c.received_ms) }));
    }
    if (c.decided_ms !== undefined) {
      bars.push(el("div", { class: "mark decided", style: "left:" + pct(c.decided_ms), title: (c.decision || "decided") + " at " + fmtMs(c.decided_ms) }));
    }
    rows.push({ start: first, label: (c.tool || "?") + " #" + c.id, kind: "call-row", status: c.status, bars });
  }
  rows.sort((a, b) => a.start - b.start);

  const ticks = el("div", { class: "gantt-axis" },
    [0, 0.25, 0.5, 0.75, 1].map((f) => el("span", { class: "tick", style: "left:" + (f * 100) + "%", text: fmtMs(Math.round(f * total)) })));
  box.replaceChildren(
    el("div", { class: "gantt-row axis-row" }, el("div", { class: "gantt-label" }), el("div", { class: "gantt-track" }, ticks)),
    ...rows.map((r) => el("div", { class: "gantt-row " + r.kind, "data-status": r.status },
      el("div", { class: "gantt-label", title: r.label, text: r.label }),
      el("div", { class: "gantt-track" }, r.bars))),
  );
}

