// The run list: one page of run summaries from `GET /runs?status=&q=&limit=&cursor=` (each
// with its goal's first line as `title` and how many calls await a decision), waiting runs
// first unless a status is chosen; the next page is the answer's `Link: <...>; rel="next"`.
"use strict";

const list = {
  limit: 50,       // runs per page
  status: "",
  q: "",
  cursors: [null], // the cursor of each page seen so far; the last is the page shown
  next: null,      // the next page's cursor, from the Link header
  timer: null,
  loading: null,
};

function runsQuery(cursor) {
  const p = new URLSearchParams();
  if (list.status) p.set("status", list.status);
  if (list.q) p.set("q", list.q);
  p.set("limit", String(list.limit));
  if (cursor) p.set("cursor", cursor);
  return "/runs?" + p.toString();
}

// The `cursor` of the Link header's rel="next" URL, or null.
function nextCursor(link) {
  if (!link) return null;
  for (const part of link.split(",")) {
    const m = /<([^>]*)>\s*;\s*rel="?next"?/.exec(part);
    if (!m) continue;
    try {
      return new URL(m[1], location.href).searchParams.get("cursor");
    } catch (_) {
      return null;
    }
  }
  return null;
}

function scheduleLoadRuns() {
  if (list.timer) return;
  list.timer = setTimeout(() => {
    list.timer = null;
    loadRuns();
  }, DEBOUNCE_MS * 3);
}

async function loadRuns() {
  const cursor = list.cursors[list.cursors.length - 1];
  const path = runsQuery(cursor);
  let answer;
  try {
    answer = await apiResponse("GET", path);
  } catch (e) {
    setConn("error", "cannot list runs: " + e.message);
    return;
  }
  if (path !== runsQuery(list.cursors[list.cursors.length - 1])) return; // the filter changed
  const runs = Array.isArray(answer.data) ? answer.data : [];
  list.next = nextCursor(answer.headers.get("Link"));
  renderRuns(runs);
}

function runTitle(r) {
  const t = typeof r.title === "string" && r.title ? r.title : "";
  return t.length > 90 ? t.slice(0, 87) + "…" : t;
}

// How long a listed run has lasted: to now while it is live, else to its last update.
function listedDuration(r) {
  const end = LIVE.includes(r.status) ? Math.max(Date.now(), r.updated_at) : r.updated_at;
  return typeof r.created_at === "number" && typeof end === "number" ? Math.max(end - r.created_at, 0) : null;
}

// What tells runs of one goal apart: its input, who submitted it, how long it has lasted, when
// it began.
function runMeta(r) {
  const parts = [];
  if (typeof r.input === "string" && r.input) parts.push("input " + r.input);
  if (r.submitted_by) parts.push("by " + r.submitted_by);
  const d = listedDuration(r);
  if (d !== null) parts.push(fmtMs(d));
  parts.push("started " + fmtTime(r.created_at));
  return parts.join(" · ");
}

function renderRuns(runs) {
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
    const waiting = r.awaiting !== undefined ? r.awaiting : r.waiting;
    li.dataset.status = r.status;
    li.classList.toggle("selected", r.id === page.selected);
    li.title = r.title || r.id;
    li.replaceChildren(
      el("span", { class: "run-title", text: runTitle(r) || "(no goal text)" }),
      el("span", { class: "run-meta muted small", text: runMeta(r) }),
      el("span", { class: "run-line" },
        el("code", { class: "rid", text: r.id }),
        waiting > 0 ? el("span", { class: "waiting", title: "calls awaiting a decision", text: waiting + " waiting" }) : null),
      el("span", { class: "run-line" },
        el("span", { class: "badge", "data-status": r.status, text: r.status }),
        el("span", { class: "muted small", title: "last update", text: fmtTime(r.updated_at || r.created_at) })),
    );
    if (ul.children[i] !== li) ul.insertBefore(li, ul.children[i] || null);
  });
  for (const li of Array.from(ul.children)) {
    if (!seen.has(li.dataset.runId)) li.remove();
  }
  const filtered = list.status || list.q;
  const empty = $("#runs-empty");
  empty.hidden = runs.length > 0;
  if (filtered) empty.textContent = "No run matches.";
  const pageNo = list.cursors.length;
  $("#runs-prev").disabled = pageNo <= 1;
  $("#runs-next").disabled = !list.next;
  $("#runs-page").textContent = pageNo > 1 || list.next ? "page " + pageNo : "";
}

function resetRuns() {
  list.cursors = [null];
  list.next = null;
  loadRuns();
}

function setupRunList() {
  let typing = null;
  $("#runs-q").addEventListener("input", (e) => {
    clearTimeout(typing);
    typing = setTimeout(() => {
      list.q = e.target.value.trim();
      resetRuns();
    }, 250);
  });
  $("#runs-status").addEventListener("change", (e) => {
    list.status = e.target.value;
    resetRuns();
  });
  $("#runs-next").addEventListener("click", () => {
    if (!list.next) return;
    list.cursors.push(list.next);
    list.next = null;
    loadRuns();
  });
  $("#runs-prev").addEventListener("click", () => {
    if (list.cursors.length <= 1) return;
    list.cursors.pop();
    loadRuns();
  });
}
