// dagloop reviewer page: plain JavaScript, no build step. It reads the HTTP API (GET /runs,
// GET /runs/{id}), follows a run live over SSE (POST /tickets, then EventSource on
// /runs/{id}/events?ticket=...), and sends decisions (POST /runs/{id}/approvals/{call}).
"use strict";

const TOKEN_KEY = "dagloop.token";
const RUNS_EVERY_MS = 3000;
const DEBOUNCE_MS = 100;
// Statuses of a run some process drives; every other one is final ("stopped": nobody drives it
// now, it continues when a server starts again).
const LIVE = ["running", "waiting"];
const EVENT_TYPES = ["call_received", "call_refused", "blocked", "unblocked", "approval_requested",
  "decision", "started", "finished", "failed", "written", "unresolved", "cancelled", "step_drained",
  "run_started", "request_started", "model_retry", "model_fallback", "stream_reasked", "context_compacted", "solution",
  "output_invalid", "run_finished"];
const STATUS_LABEL = {
  pending: "pending", blocked: "blocked", awaiting_approval: "awaiting approval", running: "running",
  done: "done", error: "failed", timeout: "timed out", panic: "panicked", cancelled: "cancelled",
  rejected: "rejected", interrupted: "interrupted", refused: "refused", unresolved: "unresolved",
};

const page = {
  selected: null,     // run id shown
  run: null,          // last GET /runs/{id}
  es: null,           // EventSource
  lastSeq: 0,         // last event id seen on the selected run
  refreshTimer: null,
  reopenTimer: null,
  reopenDelay: 500,
  tokenWaiters: null, // resolvers waiting for the token form
};

const $ = (sel, root) => (root || document).querySelector(sel);

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function pretty(v) {
  return JSON.stringify(v, null, 2);
}

function fmtMs(ms) {
  if (ms === undefined || ms === null) return "";
  if (ms < 1000) return ms + " ms";
  if (ms < 60000) return (ms / 1000).toFixed(ms < 10000 ? 2 : 1) + " s";
  return Math.floor(ms / 60000) + " min " + Math.round((ms % 60000) / 1000) + " s";
}

function fmtTime(t) {
  if (!t) return "";
  const d = new Date(typeof t === "number" ? t : Date.parse(t));
  if (isNaN(d.getTime())) return String(t);
  return d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
}

// ---------------------------------------------------------------- notices

let noticeTimer = null;
function notice(text, kind) {
  const n = $("#notice");
  n.textContent = text;
  n.dataset.kind = kind || "info";
  n.hidden = false;
  clearTimeout(noticeTimer);
  if (kind !== "conflict" && kind !== "error") {
    noticeTimer = setTimeout(() => { n.hidden = true; }, 6000);
  }
}

// ---------------------------------------------------------------- API with the token

class ApiError extends Error {
  constructor(status, body) {
    super((body && body.message) || ("HTTP " + status));
    this.status = status;
    this.code = body && body.code;
    this.body = body;
  }
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

// Shows the token form and resolves once the reviewer has given a token.
function askToken(message) {
  const form = $("#token-form");
  $("#token-error").textContent = message || "";
  form.hidden = false;
  $("#token-input").focus();
  return new Promise((resolve) => {
    (page.tokenWaiters = page.tokenWaiters || []).push(resolve);
  });
}

function tokenGiven(ev) {
  ev.preventDefault();
  const t = $("#token-input").value.trim();
  if (!t) {
    $("#token-error").textContent = "enter the token";
    return;
  }
  sessionStorage.setItem(TOKEN_KEY, t);
  $("#token-input").value = "";
  $("#token-form").hidden = true;
  const waiters = page.tokenWaiters || [];
  page.tokenWaiters = null;
  waiters.forEach((w) => w());
}

// Every state change is sent as JSON (the server refuses any other POST, so another origin's
// page cannot make one without a CORS preflight).
async function api(method, path, body) {
  if (method !== "GET" && body === undefined) body = {};
  for (;;) {
    const headers = { "Accept": "application/json" };
    const t = token();
    if (t) headers["Authorization"] = "Bearer " + t;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const r = await fetch(path, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await r.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (_) { data = { message: text }; }
    if (r.status === 401) {
      if (t) sessionStorage.removeItem(TOKEN_KEY);
      await askToken(t ? "That token was refused; try again." : "");
      continue;
    }
    if (!r.ok) throw new ApiError(r.status, data);
    return data;
  }
}

// ---------------------------------------------------------------- runs list

async function loadRuns() {
  let runs;
  try {
    runs = await api("GET", "/runs");
  } catch (e) {
    setConn("error", "cannot list runs: " + e.message);
    return;
  }
  const ul = $("#runs");
  const seen = new Set();
  runs.forEach((r, i) => {
    seen.add(r.id);
    let li = ul.querySelector(`li[data-run-id="${CSS.escape(r.id)}"]`);
    if (!li) {
      li = el("li", { "data-run-id": r.id, tabindex: 0, role: "button",
        onclick: () => select(r.id),
        onkeydown: (e) => { if (e.key === "Enter") select(r.id); } });
    }
    li.dataset.status = r.status;
    li.classList.toggle("selected", r.id === page.selected);
    li.replaceChildren(
      el("span", { class: "run-line" },
        el("code", { class: "rid", text: r.id }),
        r.waiting > 0 ? el("span", { class: "waiting", title: "calls awaiting a decision", text: r.waiting + " waiting" }) : null),
      el("span", { class: "run-line" },
        el("span", { class: "badge", "data-status": r.status, text: r.status }),
        el("span", { class: "muted small", text: fmtTime(r.updated_at || r.created_at) })),
    );
    if (ul.children[i] !== li) ul.insertBefore(li, ul.children[i] || null);
  });
  for (const li of Array.from(ul.children)) {
    if (!seen.has(li.dataset.runId)) li.remove();
  }
  $("#runs-empty").hidden = runs.length > 0;
}

// ---------------------------------------------------------------- one run, live

function select(id) {
  if (page.selected === id) return;
  page.selected = id;
  page.run = null;
  page.lastSeq = 0;
  if (location.hash.slice(1) !== id) history.replaceState(null, "", "#" + id);
  for (const li of document.querySelectorAll("#runs li[data-run-id]")) {
    li.classList.toggle("selected", li.dataset.runId === id);
  }
  $("#approvals").replaceChildren();
  $("#notice").hidden = true;
  $("#run").hidden = false;
  $("#no-run").hidden = true;
  closeStream();
  refreshRun().then(openStream);
}

function scheduleRefresh() {
  if (page.refreshTimer) return;
  page.refreshTimer = setTimeout(() => {
    page.refreshTimer = null;
    refreshRun();
  }, DEBOUNCE_MS);
}

async function refreshRun() {
  const id = page.selected;
  if (!id) return;
  let run;
  try {
    run = await api("GET", "/runs/" + encodeURIComponent(id));
  } catch (e) {
    if (id === page.selected) notice("Cannot load run " + id + ": " + e.message, "error");
    return;
  }
  if (id !== page.selected) return;
  page.run = run;
  render(run);
}

function finished(run) {
  return !!run && !LIVE.includes(run.status);
}

function setConn(state, title) {
  const c = $("#conn");
  c.dataset.state = state;
  c.textContent = state;
  c.title = title || "";
}

function closeStream() {
  if (page.es) {
    page.es.close();
    page.es = null;
  }
  clearTimeout(page.reopenTimer);
  page.reopenTimer = null;
}

// A ticket (the EventSource cannot send the token), then the stream from after the last event
// seen. The browser reconnects by itself when the connection drops (sending Last-Event-ID);
// when it gives up (the ticket expired, the server restarted), a new ticket and a new stream.
async function openStream() {
  const id = page.selected;
  if (!id || finished(page.run)) {
    setConn(finished(page.run) ? "finished" : "idle");
    return;
  }
  closeStream();
  let ticket;
  try {
    // A ticket opens this run's events only.
    ticket = (await api("POST", "/tickets", { run: id })).ticket;
  } catch (e) {
    setConn("reconnecting", e.message);
    reopenLater();
    return;
  }
  if (id !== page.selected) return;
  let url = "/runs/" + encodeURIComponent(id) + "/events?ticket=" + encodeURIComponent(ticket);
  if (page.lastSeq > 0) url += "&after=" + page.lastSeq;
  const es = new EventSource(url);
  page.es = es;
  const onEvent = (ev) => {
    const seq = Number(ev.lastEventId);
    if (seq > page.lastSeq) page.lastSeq = seq;
    page.reopenDelay = 500;
    setConn("live");
    if (ev.type === "run_finished") {
      closeStream();
      setConn("finished");
      refreshRun();
      loadRuns();
      return;
    }
    if (ev.type === "approval_requested" || ev.type === "decision") loadRuns();
    scheduleRefresh();
  };
  es.addEventListener("message", onEvent);
  EVENT_TYPES.forEach((t) => es.addEventListener(t, onEvent));
  es.onopen = () => {
    setConn("live");
    // A "cannot load" notice from while the server was away is stale now.
    if ($("#notice").dataset.kind === "error") $("#notice").hidden = true;
    scheduleRefresh();
  };
  es.onerror = () => {
    if (page.es !== es) return;
    if (es.readyState === EventSource.CLOSED) {
      setConn("reconnecting", "the stream was closed; opening a new one");
      page.es = null;
      reopenLater();
    } else {
      setConn("reconnecting", "the connection dropped; the browser reconnects");
    }
  };
}

function reopenLater() {
  clearTimeout(page.reopenTimer);
  const delay = page.reopenDelay;
  page.reopenDelay = Math.min(page.reopenDelay * 2, 10000);
  page.reopenTimer = setTimeout(async () => {
    await refreshRun();
    openStream();
  }, delay);
}

// ---------------------------------------------------------------- rendering

function render(run) {
  $("#run-id").textContent = run.id;
  const st = $("#run-status");
  st.textContent = run.status +
    (run.cancelled_by ? " by " + run.cancelled_by.principal + " (" + run.cancelled_by.channel + ")" : "");
  st.dataset.status = run.status;
  $("#run-duration").textContent = fmtMs(run.duration_ms) + " · " + run.journal_entries + " journal entries";
  $("#cancel-run").hidden = finished(run);
  renderApprovals(run);
  renderCalls(run);
  renderGantt(run);
  $("#output").textContent = run.output === null || run.output === undefined ? "—" : pretty(run.output);
  $("#output").classList.toggle("empty", run.output === null || run.output === undefined);
  $("#state").textContent = run.state === null || run.state === undefined ? "—" : pretty(run.state);
  $("#state").classList.toggle("empty", run.state === null || run.state === undefined);
  renderUsage(run.usage);
  const err = $("#run-error");
  err.hidden = !run.error;
  err.textContent = run.error ? pretty(run.error) : "";
  if (finished(run)) {
    if (page.es) closeStream();
    setConn("finished");
  }
}

// Tokens used, and the same figures for each model when more than one answered (fallback
// models, a delegate's own model).
function renderUsage(usage) {
  const box = $("#run-usage");
  box.hidden = !usage;
  if (!usage) return;
  const line = (u) => (u.input_tokens || 0) + " in · " + (u.output_tokens || 0) + " out tokens" +
    (u.estimated ? " (estimated)" : "");
  const models = Object.entries(usage.models || {});
  box.replaceChildren(el("div", { text: "usage: " + line(usage) }),
    ...models.map(([m, u]) => el("div", { class: "usage-model" }, el("code", { text: m }), " " + line(u))));
}

function statusLabel(s) {
  return STATUS_LABEL[s] || s;
}

function renderCalls(run) {
  const box = $("#calls");
  const calls = run.calls || [];
  if (!calls.length) {
    box.replaceChildren(el("p", { class: "muted", text: "No calls yet." }));
    return;
  }
  const byStep = new Map();
  for (const c of calls) {
    if (!byStep.has(c.step)) byStep.set(c.step, []);
    byStep.get(c.step).push(c);
  }
  const cols = [];
  for (const step of Array.from(byStep.keys()).sort((a, b) => a - b)) {
    cols.push(el("div", { class: "step" },
      el("div", { class: "step-title", text: "step " + step }),
      el("div", { class: "step-calls" }, byStep.get(step).map(callCard))));
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
    style: c.depth ? "margin-left:" + (c.depth * 14) + "px" : null,
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
      c.waiting_on.map((w, i) => [i ? ", " : "", el("code", { text: w })])));
  }
  const times = [];
  if (c.decision) {
    times.push(c.decision + (c.decision_timed_out ? " (timed out)" : "") +
      (c.decided_by ? " by " + c.decided_by.principal + " (" + c.decided_by.channel + ")" : ""));
  }
  if (c.started_ms !== undefined && c.ended_ms !== undefined) times.push("ran " + fmtMs(c.ended_ms - c.started_ms));
  if (times.length) card.append(el("div", { class: "call-meta muted", text: times.join(" · ") }));
  if (c.error) {
    const msg = typeof c.error === "string" ? c.error : (c.error.error || c.error.message || JSON.stringify(c.error));
    card.append(el("div", { class: "call-error", text: msg }));
  }
  return card;
}

// ---------------------------------------------------------------- approvals

function editableParams(call) {
  const p = {};
  for (const [k, v] of Object.entries(call || {})) {
    if (!k.startsWith("_")) p[k] = v;
  }
  return p;
}

function renderApprovals(run) {
  const box = $("#approvals");
  const awaiting = run.awaiting || [];
  $("#approvals-section").hidden = awaiting.length === 0;
  const keyOf = (a) => a.call_id + ":" + a.params_hash;
  const keep = new Set(awaiting.map(keyOf));
  // Decided calls go first, so that the cards still awaiting keep their places: moving a card
  // takes the focus out of a reason or an editor the reviewer is typing in.
  for (const card of Array.from(box.children)) {
    if (!keep.has(card.dataset.key)) card.remove();
  }
  awaiting.forEach((a, i) => {
    const key = keyOf(a);
    let card = box.querySelector(`.approval[data-key="${CSS.escape(key)}"]`);
    if (!card) card = approvalCard(run.id, a, key);
    if (box.children[i] !== card) box.insertBefore(card, box.children[i] || null);
  });
}

function approvalCard(runId, a, key) {
  const call = a.call || {};
  const card = el("div", { class: "approval", "data-call-id": a.call_id, "data-key": key });
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
      await api("POST", "/runs/" + encodeURIComponent(runId) + "/approvals/" + a.call_id,
        Object.assign({}, decision, { presented: a.params_hash }));
      card.classList.add("sent");
      notice("Call #" + a.call_id + " (" + call._tool + "): " + decision.decision + " sent.", "ok");
      scheduleRefresh();
      loadRuns();
    } catch (e) {
      setBusy(false);
      if (e.status === 409 && ["op.already_decided", "op.not_awaiting", "op.stale"].includes(e.code)) {
        notice("Another reviewer decided first (call #" + a.call_id + ": " + e.message + "). The run was refreshed.", "conflict");
        card.remove();
        scheduleRefresh();
        loadRuns();
      } else {
        showErrors([{ message: (e.code ? e.code + ": " : "") + e.message }].concat(
          (e.body && e.body.errors) || []));
      }
    }
  };

  const open = (what, content) => {
    showErrors([]);
    if (panel.dataset.open === what) {
      panel.dataset.open = "";
      panel.replaceChildren();
      return;
    }
    panel.dataset.open = what;
    panel.replaceChildren(...content());
    const first = panel.querySelector("textarea, input");
    if (first) first.focus();
  };

  const editPanel = () => {
    const ta = el("textarea", { class: "params-editor", spellcheck: "false", rows: 8 });
    ta.value = pretty(editableParams(call));
    const hint = el("p", { class: "muted small",
      text: "New params for " + call._tool + " (references such as †state.x are allowed). Checked against the tool's schema before sending." });
    const sendBtn = el("button", { type: "button", class: "send-edit primary", text: "Send edit",
      onclick: () => {
        let params;
        try {
          params = JSON.parse(ta.value);
        } catch (e) {
          showErrors([{ pointer: "", message: "not JSON: " + e.message }]);
          return;
        }
        const problems = checkParams(params, a.tool_schema);
        if (problems.length) {
          showErrors(problems);
          return;
        }
        send({ decision: "edit", params });
      } });
    return [hint, ta, el("div", { class: "buttons" }, sendBtn)];
  };

  const replacePanel = () => {
    const ta = el("textarea", { class: "call-editor", spellcheck: "false", rows: 8 });
    ta.value = pretty(call);
    const hint = el("p", { class: "muted small",
      text: "A whole call to run instead (with _tool; it may name another tool)." });
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
        if (repl._tool === call._tool) {
          const problems = checkParams(editableParams(repl), a.tool_schema);
          if (problems.length) {
            showErrors(problems);
            return;
          }
        }
        send({ decision: "replace", call: repl });
      } });
    return [hint, ta, el("div", { class: "buttons" }, sendBtn)];
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

  buttons.append(
    el("button", { type: "button", class: "approve primary", text: "Approve",
      onclick: () => send({ decision: "approve" }) }),
    el("button", { type: "button", class: "edit", text: "Edit…", onclick: () => open("edit", editPanel) }),
    el("button", { type: "button", class: "replace", text: "Replace…", onclick: () => open("replace", replacePanel) }),
    el("button", { type: "button", class: "reject danger", text: "Reject…", onclick: () => open("reject", rejectPanel) }),
  );

  card.append(
    el("div", { class: "approval-head" },
      el("strong", { text: call._tool }),
      el("span", { class: "muted", text: "call #" + a.call_id }),
      a.interrupted ? el("span", { class: "badge", "data-status": "interrupted", text: "interrupted by a restart: it may have run partly" }) : null,
      call._outputPath ? el("span", { class: "muted small" }, "writes ", el("code", { text: call._outputPath })) : null),
    el("pre", { class: "json params", text: pretty(editableParams(call)) }),
    buttons, panel, errors);
  return card;
}

// ---------------------------------------------------------------- schema check for edits

function typeOf(v) {
  if (v === null) return "null";
  if (Array.isArray(v)) return "array";
  if (typeof v === "number") return Number.isInteger(v) ? "integer" : "number";
  return typeof v; // string, boolean, object
}

function typeMatches(v, t) {
  const actual = typeOf(v);
  return actual === t || (t === "number" && actual === "integer");
}

function isReference(v) {
  return typeof v === "string" && /^\s*(†|\$ref:)/.test(v);
}

function ptr(base, key) {
  return base + "/" + String(key).replace(/~/g, "~0").replace(/\//g, "~1");
}

// The params checked against the tool's JSON Schema: types, required, properties,
// additionalProperties, enum/const, items, bounds and lengths. A reference may stand for any
// value (it is resolved when the call runs); meta fields (`_outputPath`, ...) are not params.
function checkParams(params, schema) {
  const out = [];
  if (typeOf(params) !== "object") {
    out.push({ pointer: "", message: "the params must be a JSON object" });
    return out;
  }
  if (schema && typeof schema === "object") checkValue(params, schema, "", out, true);
  return out;
}

function checkValue(v, s, at, out, top) {
  if (s === true || s === undefined || s === null) return;
  if (s === false) {
    out.push({ pointer: at, message: "no value is allowed here" });
    return;
  }
  if (isReference(v)) return;
  if (s.type !== undefined) {
    const types = Array.isArray(s.type) ? s.type : [s.type];
    if (!types.some((t) => typeMatches(v, t))) {
      out.push({ pointer: at, message: "must be " + types.join(" or ") + ", found " + typeOf(v) });
      return;
    }
  }
  if (s.enum && !s.enum.some((e) => JSON.stringify(e) === JSON.stringify(v))) {
    out.push({ pointer: at, message: "must be one of " + s.enum.map((e) => JSON.stringify(e)).join(", ") });
  }
  if (s.const !== undefined && JSON.stringify(s.const) !== JSON.stringify(v)) {
    out.push({ pointer: at, message: "must be " + JSON.stringify(s.const) });
  }
  if (typeof v === "number") {
    if (s.minimum !== undefined && v < s.minimum) out.push({ pointer: at, message: "must be ≥ " + s.minimum });
    if (s.maximum !== undefined && v > s.maximum) out.push({ pointer: at, message: "must be ≤ " + s.maximum });
    if (typeof s.exclusiveMinimum === "number" && v <= s.exclusiveMinimum) out.push({ pointer: at, message: "must be > " + s.exclusiveMinimum });
    if (typeof s.exclusiveMaximum === "number" && v >= s.exclusiveMaximum) out.push({ pointer: at, message: "must be < " + s.exclusiveMaximum });
  }
  if (typeof v === "string") {
    const n = Array.from(v).length;
    if (s.minLength !== undefined && n < s.minLength) out.push({ pointer: at, message: "must have at least " + s.minLength + " characters" });
    if (s.maxLength !== undefined && n > s.maxLength) out.push({ pointer: at, message: "must have at most " + s.maxLength + " characters" });
    if (typeof s.pattern === "string") {
      let re = null;
      try { re = new RegExp(s.pattern, "u"); } catch (_) { re = null; }
      if (re && !re.test(v)) out.push({ pointer: at, message: "must match " + s.pattern });
    }
  }
  if (Array.isArray(v)) {
    if (s.minItems !== undefined && v.length < s.minItems) out.push({ pointer: at, message: "must have at least " + s.minItems + " items" });
    if (s.maxItems !== undefined && v.length > s.maxItems) out.push({ pointer: at, message: "must have at most " + s.maxItems + " items" });
    if (s.items && typeof s.items === "object") v.forEach((x, i) => checkValue(x, s.items, ptr(at, i), out, false));
  }
  if (typeOf(v) === "object") {
    const props = s.properties || {};
    for (const r of s.required || []) {
      if (!(r in v)) out.push({ pointer: ptr(at, r), message: "is required" });
    }
    for (const [k, x] of Object.entries(v)) {
      if (top && k.startsWith("_")) continue;
      if (k in props) {
        checkValue(x, props[k], ptr(at, k), out, false);
      } else if (s.additionalProperties === false) {
        out.push({ pointer: ptr(at, k), message: "is not a parameter of this tool" });
      } else if (s.additionalProperties && typeof s.additionalProperties === "object") {
        checkValue(x, s.additionalProperties, ptr(at, k), out, false);
      }
    }
  }
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

// ---------------------------------------------------------------- start

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
  $("#token-form").addEventListener("submit", tokenGiven);
  $("#cancel-run").addEventListener("click", cancelRun);
  loadRuns().then(() => {
    const wanted = decodeURIComponent(location.hash.slice(1));
    if (wanted) select(wanted);
  });
  setInterval(() => {
    if (page.tokenWaiters) return; // waiting for the token form
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
