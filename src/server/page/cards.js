// The cards of the calls awaiting a decision: what the call will do (the server's `action`:
// method and URL, command line, MCP server and tool; never header values), the tool's
// description, where each param came from, and the decision buttons. An edit or a
// replacement is shown as a diff against what was presented. When somebody else decides a call
// while this reviewer has its editor or reason open, the card stays, says who decided what,
// and keeps the typed text. The "approve every…" buttons open panels from standing.js.
"use strict";

const PAST = { approve: "approved", edit: "edited", replace: "replaced", reject: "rejected",
  send_back: "sent back to the model" };

// The reviewer's deadline of a card: a countdown to `deadline_at` with what happens at it (the
// clock started when the call was first shown to somebody), or the timeout still to start.
function deadlineText(a) {
  const what = a.default_decision === "approve" ? "approved" : "rejected";
  if (a.deadline_at) {
    const left = Math.max(0, Math.ceil((a.deadline_at - Date.now()) / 1000));
    return "deadline: " + what + " by default in " + left + " s (at " +
      new Date(a.deadline_at).toISOString().slice(11, 19) + " UTC) unless you decide";
  }
  if (a.timeout_ms) return "deadline: " + what + " by default " + Math.ceil(a.timeout_ms / 1000) + " s after it is shown";
  return "no deadline: the call waits for a decision";
}

function deadlineView(a) {
  const d = el("div", { class: "deadline muted small", "data-deadline": a.deadline_at || "",
    "data-default": a.default_decision || "", text: deadlineText(a) });
  d.card = a;
  return d;
}

// The countdowns tick once a second.
setInterval(() => {
  for (const d of document.querySelectorAll(".approval .deadline")) {
    if (d.card && d.card.deadline_at) d.textContent = deadlineText(d.card);
  }
}, 1000);

function editableParams(call) {
  const p = {};
  for (const [k, v] of Object.entries(call || {})) {
    if (!k.startsWith("_")) p[k] = v;
  }
  return p;
}

// "decided by NAME (channel): approved", from the run's description of the call.
function decidedText(run, callId) {
  const c = (run.calls || []).find((x) => x.id === callId);
  if (!c || !c.decision) {
    return "no longer awaits a decision" + (c ? " (" + statusLabel(c.status) + ")" : "");
  }
  const who = c.decided_by ? c.decided_by.principal + " (" + c.decided_by.channel + ")" : "somebody else";
  return "decided by " + who + ": " + (PAST[c.decision] || c.decision) +
    (c.decision_timed_out ? " (the reviewer's time ran out)" : "");
}

function renderApprovals(run) {
  const box = $("#approvals");
  const awaiting = run.awaiting || [];
  // A card is one presentation: a call presented again (after a restart) is a new card.
  const keyOf = (a) => a.call_id + ":" + a.params_hash + ":" + (a.presentation || 0);
  const keep = new Set(awaiting.map(keyOf));
  // Decided calls go first, so that the cards still awaiting keep their places: moving a card
  // takes the focus out of a reason or an editor the reviewer is typing in.
  for (const card of Array.from(box.children)) {
    if (keep.has(card.dataset.key) || card.classList.contains("decided")) continue;
    const id = Number(card.dataset.callId);
    if (card.classList.contains("sent") || card.dataset.allowed) {
      card.remove();
    } else if (card.dataset.open) {
      // The reviewer was writing something here: keep it, say what happened.
      markDecided(card, decidedText(run, id));
    } else {
      if (!card.dataset.conflict) {
        notice("Call #" + id + " (" + card.dataset.tool + ") was " + decidedText(run, id) + ".", "info");
      }
      card.remove();
    }
  }
  let anchor = null;
  awaiting.forEach((a) => {
    const key = keyOf(a);
    let card = box.querySelector(`.approval[data-key="${CSS.escape(key)}"]`);
    if (!card) card = approvalCard(run.id, a, key);
    // The deadline may have started since the card was drawn (shown on another screen).
    const d = card.querySelector(".deadline");
    if (d && !card.classList.contains("decided")) {
      d.card = a;
      d.dataset.deadline = a.deadline_at || "";
      d.textContent = deadlineText(a);
    }
    // Right after the previous awaiting card, past any kept decided card.
    let at = anchor ? anchor.nextElementSibling : box.firstElementChild;
    while (at && at !== card && at.classList.contains("decided")) at = at.nextElementSibling;
    if (at !== card) box.insertBefore(card, at);
    anchor = card;
  });
  $("#approvals-section").hidden = box.children.length === 0;
  // A link to one call (a notification's `?run=ID&call=N`) makes its card the current one.
  if (page.focusCall !== null && page.focusCall !== undefined) {
    const linked = Array.from(box.querySelectorAll(".approval"))
      .find((c) => Number(c.dataset.callId) === page.focusCall);
    if (linked) {
      page.focusCall = null;
      page.current = linked.dataset.key;
      linked.classList.add("linked");
      markCurrent();
      linked.focus({ preventScroll: true });
      linked.scrollIntoView({ block: "center" });
      return;
    }
  }
  markCurrent();
}

// A card somebody else decided: its buttons go, its text fields stay (read-only) with what was
// typed, and a notice says who decided what. "Dismiss" removes it.
function markDecided(card, text) {
  card.classList.add("decided");
  card.classList.remove("current");
  for (const b of card.querySelectorAll("button")) b.disabled = true;
  for (const f of card.querySelectorAll("textarea, input")) f.readOnly = true;
  const dismiss = el("button", { type: "button", class: "dismiss small", text: "Dismiss",
    onclick: () => {
      card.remove();
      $("#approvals-section").hidden = $("#approvals").children.length === 0;
    } });
  card.prepend(el("div", { class: "decided-notice", role: "status" },
    el("span", { text: "Call #" + card.dataset.callId + " was " + text + ". What you typed is kept below." }),
    dismiss));
}

// One line per top-level param: what is removed (-), added (+) or kept.
function paramsDiff(before, after) {
  const b = before || {};
  const a = after || {};
  const keys = Array.from(new Set([...Object.keys(b), ...Object.keys(a)]));
  const line = (cls, sign, k, v) => el("span", { class: "diff-line " + cls, text: sign + " " + k + ": " + JSON.stringify(v) });
  const lines = [];
  for (const k of keys) {
    const inB = Object.prototype.hasOwnProperty.call(b, k);
    const inA = Object.prototype.hasOwnProperty.call(a, k);
    if (inB && inA && JSON.stringify(b[k]) === JSON.stringify(a[k])) {
      lines.push(line("same", " ", k, a[k]));
      continue;
    }
    if (inB) lines.push(line("del", "-", k, b[k]));
    if (inA) lines.push(line("add", "+", k, a[k]));
  }
  return el("pre", { class: "diff" }, lines.flatMap((l) => [l, "\n"]));
}

// What the call will do, as the server describes it (`action`).
function actionView(a) {
  const act = a.action;
  if (!act) return null;
  const row = (...c) => el("div", { class: "action", "data-kind": act.kind }, ...c);
  switch (act.kind) {
    case "http":
      return row(
        el("span", { class: "verb", text: act.method }), " ",
        el("code", { class: "url", text: act.url }),
        act.headers && act.headers.length
          ? el("div", { class: "muted small headers" }, "headers: ",
            act.headers.flatMap((h, i) => [i ? ", " : "", el("code", { text: h })]), " (values hidden)")
          : null,
        act.body !== undefined && act.body !== null
          ? el("div", { class: "small" }, "body ", el("code", { class: "body", text: JSON.stringify(act.body) }))
          : null);
    case "shell":
      return row(el("span", { class: "verb", text: "runs" }), " ", el("code", { class: "cmdline", text: act.line }));
    case "mcp":
      return row(el("span", { class: "verb", text: "MCP" }), " ",
        act.server ? ["server ", el("code", { class: "mcp-server", text: act.server }), " · "] : null,
        "tool ", el("code", { class: "mcp-tool", text: act.tool }));
    case "delegate":
      return row(el("span", { class: "verb", text: "agent" }), " runs a nested agent",
        act.goal ? [" (", el("code", { text: act.goal }), ")"] : null);
    case "latent":
      return row("nothing runs: the model writes the result itself");
    case "misconfigured":
      return row(el("span", { class: "verb bad", text: "misconfigured" }), " ", act.reason);
    default:
      return row("runs the ", el("code", { text: act.activity || act.kind }), " activity");
  }
}

// Each param with its value and where it came from.
function sourcesView(a, call) {
  const sources = a.sources || Object.entries(editableParams(call)).map(([param, value]) => ({ param, value, from: "model" }));
  if (!sources.length) return el("p", { class: "muted small", text: "no params" });
  return el("table", { class: "params-table" },
    el("tbody", {}, sources.map((s) => el("tr", { "data-param": s.param, "data-from": s.from },
      el("th", {}, el("code", { text: s.param })),
      el("td", {}, el("code", { class: "value", text: JSON.stringify(s.value) })),
      el("td", { class: "source muted small" },
        s.from === "reference"
          ? [el("code", { class: "wrote", text: typeof s.wrote === "string" ? s.wrote : JSON.stringify(s.wrote) }), " → resolved"]
          : "as the model wrote it")))));
}

function approvalCard(runId, a, key) {
  const call = a.call || {};
  const card = el("div", { class: "approval", "data-call-id": a.call_id, "data-key": key,
    "data-tool": call._tool, tabindex: -1, onclick: () => { page.current = key; markCurrent(); } });
  const errors = el("ul", { class: "errors" });
  const showErrors = (list) => {
    errors.replaceChildren(...list.map((e) => el("li", {},
      e.pointer !== undefined ? el("code", { text: e.pointer || "/" }) : null,
      e.pointer !== undefined ? " " : null, e.message)));
  };
  const panel = el("div", { class: "panel" });
  const buttons = el("div", { class: "buttons" });
  const setBusy = (busy) => {
    for (const b of card.querySelectorAll("button")) b.disabled = busy;
  };

  const send = async (decision) => {
    showErrors([]);
    setBusy(true);
    try {
      const r = await api("POST", "/runs/" + encodeURIComponent(runId) + "/approvals/" + a.call_id,
        Object.assign({}, decision, a.presentation
          ? { presented: a.params_hash, presentation: a.presentation }
          : { presented: a.params_hash }));
      card.classList.add("sent");
      card.classList.remove("current");
      // Applied: the run moves. Recorded: somebody else must continue the run; say who.
      const recorded = r && r.status === "recorded";
      notice("Call #" + a.call_id + " (" + call._tool + "): " + decision.decision +
        (recorded ? " recorded, not applied yet: " + (r.detail || "the run is not driven now") + "." : " applied."),
        recorded ? "info" : "ok");
      scheduleRefresh();
      loadRuns();
    } catch (e) {
      setBusy(false);
      if (e.status === 409 && ["op.already_decided", "op.not_awaiting", "op.stale",
        "op.stale_presentation"].includes(e.code)) {
        notice("Another reviewer decided first (call #" + a.call_id + ": " + e.message + "). The run was refreshed.", "conflict");
        card.dataset.conflict = "1";
        // Without an open editor there is nothing of the reviewer's to keep.
        if (!card.dataset.open) card.remove();
        scheduleRefresh();
        loadRuns();
      } else {
        showErrors([{ message: (e.code ? e.code + ": " : "") + e.message }].concat(
          (e.body && e.body.errors) || []));
      }
    }
  };

  // A standing approval from this card (standing.js): the card's call is among those it
  // approves.
  const give = async (body, what) => {
    showErrors([]);
    setBusy(true);
    try {
      const r = await api("POST", "/runs/" + encodeURIComponent(runId) + "/standing", body);
      // A schema may leave this very call out: the card stays usable until the run says the
      // call was approved, and then goes without a "decided by somebody" notice.
      card.dataset.allowed = "1";
      card.dataset.open = "";
      panel.dataset.open = "";
      panel.replaceChildren();
      setBusy(false);
      notice("Standing approval " + (r.standing || "") + " given: " + what + ".", "ok");
      scheduleRefresh();
      loadRuns();
    } catch (e) {
      setBusy(false);
      showErrors([{ message: (e.code ? e.code + ": " : "") + e.message }]);
    }
  };

  const open = (what, content) => {
    showErrors([]);
    if (panel.dataset.open === what) {
      panel.dataset.open = "";
      card.dataset.open = "";
      panel.replaceChildren();
      return;
    }
    panel.dataset.open = what;
    card.dataset.open = what;
    panel.replaceChildren(...content());
    const first = panel.querySelector("textarea, input");
    if (first) first.focus();
  };

  const editPanel = () => {
    const ta = el("textarea", { class: "params-editor", spellcheck: "false", rows: 8 });
    ta.value = pretty(editableParams(call));
    const hint = el("p", { class: "muted small",
      text: "New params for " + call._tool + " (references such as †state.x are allowed). Checked against the tool's schema before sending." });
    const diff = el("div", { class: "edit-diff" });
    const showDiff = () => {
      let edited;
      try {
        edited = JSON.parse(ta.value);
      } catch (_) {
        diff.replaceChildren(el("p", { class: "muted small", text: "(not JSON yet)" }));
        return;
      }
      diff.replaceChildren(el("div", { class: "muted small", text: "against what the model proposed:" }),
        paramsDiff(editableParams(call), edited));
      followEdit(card, runId, a.call_id, edited);
    };
    ta.addEventListener("input", showDiff);
    // The errors were about the text sent; once it changes they no longer describe it.
    ta.addEventListener("input", () => showErrors([]));
    showDiff();
    const sendBtn = el("button", { type: "button", class: "send-edit primary", text: "Send edit",
      onclick: () => {
        let params;
        try {
          params = JSON.parse(ta.value);
        } catch (e) {
          showErrors([{ pointer: "", message: "not JSON: " + e.message }]);
          return;
        }
        // The server checks the edit, by the run's own rules (a param holding a reference is
        // checked once resolved); one it refuses changes nothing, and its reasons show here.
        send({ decision: "edit", params });
      } });
    return [hint, ta, diff, el("div", { class: "buttons" }, sendBtn)];
  };

  const replacePanel = () => {
    const ta = el("textarea", { class: "call-editor", spellcheck: "false", rows: 8 });
    ta.value = pretty(call);
    const hint = el("p", { class: "muted small",
      text: "A whole call to run instead (with _tool; it may name another tool)." });
    const diff = el("div", { class: "edit-diff" });
    const showDiff = () => {
      let repl;
      try {
        repl = JSON.parse(ta.value);
      } catch (_) {
        diff.replaceChildren(el("p", { class: "muted small", text: "(not JSON yet)" }));
        return;
      }
      const before = Object.assign({ _tool: call._tool }, editableParams(call));
      const after = repl && typeof repl === "object" && !Array.isArray(repl)
        ? Object.assign({ _tool: repl._tool }, editableParams(repl)) : {};
      diff.replaceChildren(el("div", { class: "muted small", text: "against what the model proposed:" }),
        paramsDiff(before, after));
    };
    ta.addEventListener("input", showDiff);
    showDiff();
    const sendBtn = el("button", { type: "button", class: "send-replace primary", text: "Send replacement",
      onclick: () => {
        let repl;
        try {
          repl = JSON.parse(ta.value);
        } catch (e) {
          showErrors([{ pointer: "", message: "not JSON: " + e.message }]);
          return;
        }
        if (!repl || typeof repl !== "object" || Array.isArray(repl) || typeof repl._tool !== "string") {
          showErrors([{ pointer: "/_tool", message: "a call is an object with a string _tool" }]);
          return;
        }
        send({ decision: "replace", call: repl });
      } });
    return [hint, ta, diff, el("div", { class: "buttons" }, sendBtn)];
  };

  const rejectPanel = () => {
    const input = el("input", { class: "reject-reason", type: "text", placeholder: "why (the model is told)" });
    const sendBtn = el("button", { type: "button", class: "send-reject danger", text: "Send rejection",
      onclick: () => {
        const reason = input.value.trim();
        if (!reason) {
          showErrors([{ message: "give a reason" }]);
          return;
        }
        send({ decision: "reject", reason });
      } });
    input.addEventListener("keydown", (e) => { if (e.key === "Enter") sendBtn.click(); });
    return [input, sendBtn];
  };

  // Not a veto: the model is told what to do differently and may propose another call.
  const sendBackPanel = () => {
    const input = el("input", { class: "send-back-feedback", type: "text",
      placeholder: "what the model should do differently" });
    const sendBtn = el("button", { type: "button", class: "send-send-back primary", text: "Send back",
      onclick: () => {
        const feedback = input.value.trim();
        if (!feedback) {
          showErrors([{ message: "say what to do differently" }]);
          return;
        }
        send({ decision: "send_back", feedback });
      } });
    input.addEventListener("keydown", (e) => { if (e.key === "Enter") sendBtn.click(); });
    return [input, sendBtn];
  };

  // (`append` writes a null as the text "null": the optional pieces are left out instead.)
  const present = (...parts) => parts.filter((p) => p !== null && p !== undefined);
  buttons.append(...present(
    el("button", { type: "button", class: "approve primary", text: "Approve",
      onclick: () => send({ decision: "approve" }) }),
    el("button", { type: "button", class: "edit", text: "Edit…", onclick: () => open("edit", editPanel) }),
    el("button", { type: "button", class: "replace", text: "Replace…", onclick: () => open("replace", replacePanel) }),
    el("button", { type: "button", class: "send-back", text: "Send back…",
      title: "the call does not run; the model is told what to do differently (not a veto)",
      onclick: () => open("send-back", sendBackPanel) }),
    el("button", { type: "button", class: "reject danger", text: "Reject…",
      title: "the call does not run; the model is told not to retry it",
      onclick: () => open("reject", rejectPanel) }),
    el("button", { type: "button", class: "allow-tool", text: "Approve every " + call._tool + " call…",
      title: "a standing approval: this call and every later call of the tool (optionally only those matching a schema)",
      onclick: () => open("allow-tool", () => allowToolPanel(call, give, showErrors)) }),
    a.downstream && a.downstream.length
      ? el("button", { type: "button", class: "allow-calls",
        text: "Approve with the " + a.downstream.length + " waiting on it…",
        title: "a standing approval: this call and the calls waiting on it, exactly as shown",
        onclick: () => open("allow-calls", () => allowCallsPanel(a, give)) })
      : null,
  ));

  const above = (a.path || []).slice(0, -1);
  card.append(...present(
    el("div", { class: "approval-head" },
      el("strong", { text: call._tool }),
      el("span", { class: "muted", text: "call #" + a.call_id }),
      above.length ? el("span", { class: "muted small nested-in" }, "in the nested agent of call ",
        above.map((p, i) => [i ? " › " : "", el("code", { text: "#" + p })])) : null,
      a.interrupted ? el("span", { class: "badge", "data-status": "interrupted", text: "interrupted by a restart: it may have run partly" }) : null,
      call._outputPath ? el("span", { class: "muted small" }, "writes ", el("code", { text: call._outputPath })) : null),
    a.description ? el("p", { class: "description", text: String(a.description) }) : null,
    actionView(a),
    a.rule ? el("div", { class: "rule muted small" }, "asked by ", el("code", { text: a.rule })) : null,
    deadlineView(a),
    sourcesView(a, call),
    el("details", { class: "as-json" }, el("summary", { class: "muted small", text: "params as JSON" }),
      el("pre", { class: "json params", text: pretty(editableParams(call)) })),
    buttons, panel, errors));
  return card;
}
