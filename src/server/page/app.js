// dagloop reviewer page: plain JavaScript, no build step. It reads the HTTP API (GET /runs,
// GET /runs/{id}), follows a run live over SSE (POST /tickets sets a single-use cookie, then
// EventSource on /runs/{id}/events), and sends decisions (POST /runs/{id}/approvals/{call}).
//
// The page is several classic scripts sharing one global scope, loaded in order:
//   app.js   helpers, the API with the token, the selected run and its live stream
//   runs.js  the run list: filter, search, pages
//   calls.js the calls (nested agents' calls inside their parent) and the timeline
//   context.js the goal, its input and submitter; the run's duration, counted on while live
//   graph.js the calls as a graph with an edge per dependency
//   audit.js the audit tab
//   queue.js the queue across runs ("next waiting call")
//   cards.js the cards awaiting a decision: what the call will do, sources, edit diff
//   preview.js an edit's preview: the card's action follows the edit being typed
//   standing.js standing approvals from a card (a tool, a call and those waiting on it) and
//            the run's standing approvals
//   keys.js  keyboard shortcuts and their help
//   start.js wiring and the light list poll
"use strict";

const TOKEN_KEY = "dagloop.token";
// The run list's light poll (one page of summaries); the selected run follows its stream.
const RUNS_EVERY_MS = 10000;
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
  current: null,      // the key of the card the shortcuts act on
  focusCall: null,    // the call a link named (`?run=RUN&call=N`), focused once its card shows
  tab: "calls",       // the tab shown: the calls (graph, calls, timeline) or the audit
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
  for (const c of children.flat(Infinity)) {
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
  return (await apiResponse(method, path, body)).data;
}

// The answer's JSON and its headers (the run list reads its `Link` header).
async function apiResponse(method, path, body) {
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
    return { data, headers: r.headers };
  }
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
  $("#audit").replaceChildren();
  page.current = null;
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
  try {
    // A ticket opens this run's events only, once; it comes back as a cookie the EventSource
    // sends (never in the URL).
    await api("POST", "/tickets", { run: id });
  } catch (e) {
    setConn("reconnecting", e.message);
    reopenLater();
    return;
  }
  if (id !== page.selected) return;
  let url = "/runs/" + encodeURIComponent(id) + "/events";
  if (page.lastSeq > 0) url += "?after=" + page.lastSeq;
  const es = new EventSource(url);
  page.es = es;
  const onEvent = (ev) => {
    const seq = Number(ev.lastEventId);
    if (seq > page.lastSeq) page.lastSeq = seq;
    page.reopenDelay = 500;
    setConn("live");
    // A nested agent's run_finished (it has a `parent`: the delegate call that ran it) ends
    // that agent only; the run goes on.
    if (ev.type === "run_finished" && !eventParent(ev)) {
      closeStream();
      setConn("finished");
      refreshRun();
      scheduleLoadRuns();
      return;
    }
    if (ev.type === "approval_requested" || ev.type === "decision") scheduleLoadRuns();
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

function eventParent(ev) {
  try {
    const data = JSON.parse(ev.data);
    return data && data.parent !== undefined && data.parent !== null ? data.parent : null;
  } catch (_) {
    return null;
  }
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
  renderDuration(run);
  renderContext(run);
  $("#cancel-run").hidden = finished(run);
  $("#follow-up").hidden = !finished(run);
  renderApprovals(run);
  renderStanding(run);
  renderGraph(run);
  renderCalls(run);
  renderGantt(run);
  if (page.tab === "audit") loadAudit();
  if (page.tab === "fork") renderFork(run);
  $("#output").textContent = run.output === null || run.output === undefined ? "—" : pretty(run.output);
  $("#output").classList.toggle("empty", run.output === null || run.output === undefined);
  $("#state").textContent = run.state === null || run.state === undefined ? "—" : pretty(run.state);
  $("#state").classList.toggle("empty", run.state === null || run.state === undefined);
  renderUsage(run.usage);
  renderError(run.error);
  if (finished(run)) {
    if (page.es) closeStream();
    setConn("finished");
  }
}

// Why a run failed, in words: its message and code, then each cause's (with the output errors
// of a model that never gave a valid output), and the whole error as JSON below.
function renderError(error) {
  const box = $("#run-error");
  box.hidden = !error;
  if (!error) {
    box.replaceChildren();
    return;
  }
  const line = (e, lead) => el("p", { class: lead ? "error-words" : "error-cause" },
    lead ? null : "because: ", el("strong", { text: e.message || "(no message)" }),
    e.code ? " " : null, e.code ? el("code", { text: e.code }) : null);
  const parts = [line(error, true)];
  for (let c = error.cause, depth = 0; c && typeof c === "object" && depth < 8; c = c.cause, depth++) {
    parts.push(line(c, false));
    if (Array.isArray(c.output_errors) && c.output_errors.length) {
      parts.push(el("ul", { class: "output-errors" },
        ...c.output_errors.map((o) => el("li", { text: typeof o === "string" ? o : JSON.stringify(o) }))));
    }
  }
  parts.push(el("details", {}, el("summary", { text: "the error as JSON" }),
    el("pre", { class: "json error", text: pretty(error) })));
  box.replaceChildren(...parts);
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